/* loadgen: lock-step NDJSON request/response load over a Unix socket.
 *
 * Usage: loadgen SOCKET NCONN WARMUP_MS MEASURE_MS REQUEST_LINE
 * Each of NCONN connections keeps exactly one request in flight; a reply is one line.
 * Prints one JSON object: {"requests":N,"errors":E,"p50_us":..,"p99_us":..,"rps":..}.
 * Written in C so the client's own cost stays out of the server's numbers.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

typedef struct { int fd; double sent_at; size_t have; char buf[1 << 16]; } conn_t;

static double now_us(void) {
    struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc != 6) { fprintf(stderr, "usage: loadgen SOCKET NCONN WARMUP_MS MEASURE_MS LINE\n"); return 2; }
    const char *path = argv[1];
    int n = atoi(argv[2]);
    double warm = atof(argv[3]) * 1000, measure = atof(argv[4]) * 1000;
    size_t llen = strlen(argv[5]);
    char *line = malloc(llen + 2); memcpy(line, argv[5], llen); line[llen++] = '\n';
    conn_t *c = calloc(n, sizeof(conn_t));
    int ep = epoll_create1(0);
    size_t cap = 1 << 20, nlat = 0; double *lat = malloc(cap * sizeof(double));
    long errors = 0;
    for (int i = 0; i < n; i++) {
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        strncpy(a.sun_path, path, sizeof(a.sun_path) - 1);
        c[i].fd = socket(AF_UNIX, SOCK_STREAM, 0);
        if (connect(c[i].fd, (struct sockaddr *)&a, sizeof a) < 0) { perror("connect"); return 1; }
        struct epoll_event ev = {.events = EPOLLIN, .data.u32 = i};
        epoll_ctl(ep, EPOLL_CTL_ADD, c[i].fd, &ev);
    }
    double start = now_us(), t_measure = start + warm, t_end = t_measure + measure;
    for (int i = 0; i < n; i++) { c[i].sent_at = now_us(); if (write(c[i].fd, line, llen) != (ssize_t)llen) errors++; }
    struct epoll_event evs[256];
    long done_in_window = 0;
    while (now_us() < t_end) {
        int k = epoll_wait(ep, evs, 256, 100);
        for (int e = 0; e < k; e++) {
            conn_t *x = &c[evs[e].data.u32];
            ssize_t r = read(x->fd, x->buf + x->have, sizeof x->buf - x->have);
            if (r <= 0) { errors++; epoll_ctl(ep, EPOLL_CTL_DEL, x->fd, NULL); continue; }
            x->have += r;
            char *nl;
            while ((nl = memchr(x->buf, '\n', x->have))) {
                double t = now_us();
                if (strstr(x->buf, "\"error\"") && (char *)strstr(x->buf, "\"error\"") < nl) errors++;
                if (t >= t_measure && t < t_end) {
                    if (nlat == cap) { cap *= 2; lat = realloc(lat, cap * sizeof(double)); }
                    lat[nlat++] = t - x->sent_at; done_in_window++;
                }
                size_t used = nl - x->buf + 1;
                memmove(x->buf, nl + 1, x->have - used); x->have -= used;
                x->sent_at = now_us();
                if (write(x->fd, line, llen) != (ssize_t)llen) errors++;
            }
            if (x->have == sizeof x->buf) { errors++; x->have = 0; }
        }
    }
    qsort(lat, nlat, sizeof(double), cmp_double);
    double p50 = nlat ? lat[nlat / 2] : 0, p99 = nlat ? lat[(size_t)(nlat * 0.99)] : 0;
    printf("{\"requests\":%ld,\"errors\":%ld,\"p50_us\":%.1f,\"p99_us\":%.1f,\"rps\":%.0f}\n",
           done_in_window, errors, p50, p99, done_in_window / (measure / 1e6));
    return 0;
}
