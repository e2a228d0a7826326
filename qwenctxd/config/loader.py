"""The daemon's configuration store: layered settings, per-project views, live reload.

Precedence, lowest to highest: built-in defaults < ``~/.qwen/settings.json`` <
``<project>/.qwen/settings.json`` < ``~/.qwen/.env`` < ``<project>/.qwen/.env`` <
``$XDG_CONFIG_HOME/qwenctxd/config.toml`` < environment (reading and validating each source is
``layers.py``'s job). The ``.env`` files supply ``OPENAI_*`` as Qwen Code reads them, below
the real environment; they are read at start-up and at each reload of the global settings.

``load_global`` builds the settings without a project and raises ``ConfigError`` (file, key,
problem): the daemon refuses to start with that message. ``for_project(root)`` adds that
project's settings file; it is a dict lookup once the root has been seen (it runs on every
request) and never raises: an invalid project file is logged, reported in
``project_errors[root]`` and the global settings are used instead.

``run(hub, tasks=...)`` keeps everything current: every file in play is watched through a
:class:`~qwenctxd.watch.WatchedCache` (key None for the global files, a root for a project's)
whose values are the files' stamps as read; an edit made between reading and watching is caught
by its re-check once the watches are live. The settings themselves stay in this store's dicts,
so ``for_project`` is a plain lookup from any thread. A valid edit replaces the settings, bumps ``generation`` and
calls the listeners; a bad edit is logged at error level (file, key, problem), kept in
``last_error`` and the last good settings stay in force. Settings objects handed out are
shared: treat them as read-only.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import anyio.from_thread
import anyio.to_thread
import structlog
from anyio.abc import TaskGroup, TaskStatus

from qwenctxd.config.layers import (
    Layer,
    build,
    dotenv_layer,
    env_layer,
    read_config_toml,
    read_settings_json,
)
from qwenctxd.config.schema import Settings
from qwenctxd.paths import home as user_home
from qwenctxd.paths import qwen_home
from qwenctxd.protocol.errors import ConfigError
from qwenctxd.tasks import TaskRegistry
from qwenctxd.watch import Watched, WatchedCache, WatchHub

__all__ = ["ConfigStore", "Listener", "ProjectListener"]

log = structlog.get_logger("qwenctxd.config")

Listener = Callable[[Settings], None]
ProjectListener = Callable[[Path, Settings], None]


def _abs(path: Path) -> Path:
    return Path(os.path.abspath(os.path.expanduser(path)))


def _project_files(root: Path) -> tuple[Path, ...]:
    """A project's settings file and its ``.env``."""
    return (_abs(Path(root) / ".qwen" / "settings.json"), _abs(Path(root) / ".qwen" / ".env"))


@dataclass(slots=True)
class _Project:
    root: Path
    file: Path
    layer: Layer  # last good project layer (empty if missing or never valid)
    dotenv: Layer = field(default_factory=lambda: Layer("dotenv", ""))  # <root>/.qwen/.env
    stamp: _Stamp = ()  # the files as they were just before the last read


_Stamp = tuple[tuple[int, int, int] | None, ...]


def _stamp(files: tuple[Path, ...]) -> _Stamp:
    """(inode, size, mtime) of each file, None for a missing one: what a re-check compares."""
    out: list[tuple[int, int, int] | None] = []
    for f in files:
        try:
            st = os.stat(f)
        except OSError:
            out.append(None)
        else:
            out.append((st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(out)


class ConfigStore:
    """Layered configuration with per-project views and live reload; see the module docstring.

    ``home``: the directory holding ``.qwen`` (default ``$QWEN_HOME`` or ``$HOME/.qwen``);
    ``xdg_config``: the XDG config base (default ``$XDG_CONFIG_HOME`` or ``<home>/.config``);
    ``environ``: the environment to read (default ``os.environ``, read at each load).
    Call its methods from the event-loop thread (``for_project`` also works from anyio worker
    threads).
    """

    def __init__(
        self,
        *,
        home: Path | None = None,
        xdg_config: Path | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self._environ = environ
        env = self._env_mapping()
        home_dir = home if home is not None else user_home(env)
        # an explicit ``home`` is the directory holding .qwen (QWEN_HOME is not consulted)
        qwen_dir = qwen_home(env if home is None else {"HOME": str(home_dir)})
        xdg = xdg_config or Path(env.get("XDG_CONFIG_HOME") or home_dir / ".config")
        self.user_settings_file = _abs(qwen_dir / "settings.json")
        self.config_file = _abs(xdg / "qwenctxd" / "config.toml")
        self.user_env_file = _abs(qwen_dir / ".env")
        self._dotenv = Layer("dotenv", str(self.user_env_file), self.user_env_file)
        self._user = Layer("settings", str(self.user_settings_file), self.user_settings_file)
        self._toml = Layer("toml", str(self.config_file), self.config_file)
        self._env = Layer("env", "environment")
        self._global: Settings | None = None
        self._projects: dict[Path, _Project] = {}
        self._cache: dict[Path, Settings] = {}  # the for_project fast path
        self.project_errors: dict[Path, str] = {}
        self._errors: dict[str, str] = {}  # file -> message of its outstanding bad edit
        self.generation = 0
        self._listeners: list[Listener] = []
        self._project_listeners: list[ProjectListener] = []
        self._global_stamp: _Stamp = ()
        self._watched: WatchedCache[Path | None, _Stamp] | None = None
        self._tg: TaskGroup | None = None
        self._loop_thread: int | None = None
        self._lock: anyio.Lock | None = None

    def _env_mapping(self) -> Mapping[str, str]:
        return os.environ if self._environ is None else self._environ

    # -- reading --------------------------------------------------------------------------
    @property
    def global_settings(self) -> Settings:
        """The last good settings without a project layer."""
        if self._global is None:
            raise RuntimeError("ConfigStore.load_global() has not been called")
        return self._global

    @property
    def last_error(self) -> str | None:
        """The most recent bad edit still in effect (None once every file reads cleanly)."""
        return next(reversed(self._errors.values()), None)

    @property
    def files(self) -> list[Path]:
        """Existing files in play, global ones in precedence order, then project files."""
        out = [layer.path for layer in (self._user, self._dotenv, self._toml)
               if layer.present and layer.path]
        out.extend(p.file for p in self._projects.values() if p.layer.present)
        return out

    def global_layers(self) -> list[Layer]:
        """The global layers in precedence order, lowest first (user settings.json,
        config.toml, environment): where ``qwenctxd.config.sources`` looks a key up."""
        return [self._user, self._toml, self._env]

    def load_global(self) -> Settings:
        """Read defaults + user settings + config.toml + environment; ConfigError if invalid."""
        env = env_layer(self._env_mapping())
        self._global_stamp = _stamp(self._global_files)
        user = read_settings_json(self.user_settings_file)
        dotenv = dotenv_layer(self.user_env_file)
        toml = read_config_toml(self.config_file)
        settings = build([user, dotenv, toml, env])
        previous = self._global
        self._env, self._user, self._toml, self._dotenv = env, user, toml, dotenv
        self._clear_global_errors()
        self._commit_global(settings)
        log.info(
            "config.loaded",
            files=[str(f) for f in self.files],
            generation=self.generation,
            endpoint_configured=settings.endpoint().configured,
        )
        if previous is not None and previous != settings:
            self._notify(settings)
        return settings

    def for_project(self, root: Path) -> Settings:
        """Settings for the project at ``root`` (cached per root; never raises ConfigError)."""
        cached = self._cache.get(root)
        if cached is not None:
            return cached
        return self._add_project(root)

    def forget_project(self, root: Path) -> None:
        """Drop a project's cached settings and stop watching its settings file."""
        proj = self._projects.pop(root, None)
        self._cache.pop(root, None)
        self.project_errors.pop(root, None)
        if proj is not None:
            self._errors.pop(str(proj.file), None)
            if self._watched is not None:
                self._watched.forget(root)

    def add_listener(self, callback: Listener) -> Callable[[], None]:
        """Call ``callback(settings)`` after each change of the global settings; returns a
        function that removes it."""
        self._listeners.append(callback)
        return lambda: self._listeners.remove(callback) if callback in self._listeners else None

    on_change = add_listener

    def add_project_listener(self, callback: ProjectListener) -> Callable[[], None]:
        """Call ``callback(root, settings)`` after an edit of a project's settings file."""
        self._project_listeners.append(callback)
        return lambda: (
            self._project_listeners.remove(callback)
            if callback in self._project_listeners
            else None
        )

    # -- projects -------------------------------------------------------------------------
    def _add_project(self, root: Path) -> Settings:
        glob = self.global_settings
        file = _abs(Path(root) / ".qwen" / "settings.json")
        layer = Layer("settings", str(file), file)
        stamp = _stamp(_project_files(root))
        if file != self.user_settings_file:  # the home directory as a project: no extra layer
            try:
                layer = read_settings_json(file)
            except ConfigError as exc:
                self._project_failed(root, exc, fallback="global settings")
        proj = _Project(root, file, layer, stamp=stamp)
        if file != self.user_settings_file:
            proj.dotenv = dotenv_layer(_abs(Path(root) / ".qwen" / ".env"))
        settings = self._project_settings(proj) if layer.data or proj.dotenv.data else glob
        self._projects[root] = proj
        self._cache[root] = settings
        if file != self.user_settings_file:
            self._watch_from_any_thread(root)
        return settings

    def _project_settings(self, proj: _Project) -> Settings:
        """Merged settings for ``proj``; the global ones if its layer does not merge."""
        glob = self.global_settings
        if not proj.layer.data and not proj.dotenv.data:
            return glob
        try:
            return build([self._user, proj.layer, self._dotenv, proj.dotenv, self._toml,
                          self._env])
        except ConfigError as exc:
            self._project_failed(proj.root, exc, fallback="global settings")
            return glob

    def _project_failed(self, root: Path, exc: ConfigError, *, fallback: str) -> None:
        self.project_errors[root] = str(exc)
        log.error(
            "config.project_invalid",
            project=str(root),
            file=exc.file,
            key=exc.key,
            problem=exc.problem,
            using=fallback,
        )

    def _commit_global(self, settings: Settings) -> None:
        self._global = settings
        self.generation += 1
        for proj in self._projects.values():
            self._cache[proj.root] = self._project_settings(proj)

    # -- live reload ----------------------------------------------------------------------
    async def run(
        self, hub: WatchHub, *, tasks: TaskRegistry | None = None,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Watch every file in play through ``hub`` (which must be running) until cancelled;
        ``tasks`` runs the re-checks (a registry of its own when None).

        ``task_status.started()`` once the watches are registered and anything edited since
        ``load_global`` has been read.
        """
        if self._global is None:
            self.load_global()
        self._lock = anyio.Lock()
        self._loop_thread = threading.get_ident()
        try:
            async with anyio.create_task_group() as tg:
                if tasks is None:
                    tasks = TaskRegistry()
                    tasks.attach(tg)
                self._tg = tg
                self._watched = WatchedCache(hub, tasks, "config", on_stale=self._on_stale,
                                             project_of=lambda root: None)
                self._watch(None)
                for root in list(self._projects):
                    self._watch(root)
                await self._watched.live()
                await self._reload(True, list(self._projects))  # edits made before the watch
                task_status.started()
                await anyio.sleep_forever()
        finally:
            if self._watched is not None:
                for key in (None, *self._projects):
                    self._watched.forget(key)
            self._watched = self._tg = None
            self._loop_thread = None

    @property
    def _global_files(self) -> tuple[Path, ...]:
        return (self.user_settings_file, self.config_file, self.user_env_file)

    def _watch(self, root: Path | None) -> None:
        """Watch the global files (``root`` None) or a project's, from the loop thread."""
        watched = self._watched
        if watched is None:
            return
        if root is None:
            files, stamp = self._global_files, self._global_stamp
        else:
            proj = self._projects.get(root)
            if proj is None or proj.file == self.user_settings_file:
                return
            files, stamp = _project_files(root), proj.stamp
        wanted = frozenset(files)
        watched.publish(root, Watched(
            stamp, {f.parent for f in files}, relevant=wanted.__contains__,
            changed=lambda: _stamp(files) != stamp))

    def _watch_from_any_thread(self, root: Path) -> None:
        if self._watched is None:
            return
        if threading.get_ident() == self._loop_thread:
            self._watch(root)
            return
        try:
            anyio.from_thread.run_sync(self._watch, root)
        except RuntimeError:
            log.warning("config.watch_from_foreign_thread", project=str(root))

    def _on_stale(self, root: Path | None, _stamp_read: _Stamp) -> None:
        """A watched file changed (or changed before its watch was live): re-read it."""
        if self._tg is not None:
            self._tg.start_soon(self._reload, root is None, [] if root is None else [root])

    async def _reload(self, do_global: bool, roots: list[Path]) -> None:
        assert self._lock is not None
        async with self._lock:
            if do_global:
                await self._reload_global()
            for root in roots:
                await self._reload_project(root)

    def _read_global_files(self) -> tuple[Layer, Layer, Layer]:
        self._global_stamp = _stamp(self._global_files)
        return (read_settings_json(self.user_settings_file), read_config_toml(self.config_file),
                dotenv_layer(self.user_env_file))

    async def _reload_global(self) -> None:
        try:
            user, toml, dotenv = await anyio.to_thread.run_sync(self._read_global_files)
            settings = build([user, dotenv, toml, self._env])
        except ConfigError as exc:
            self._bad_edit(exc)
            return
        self._clear_global_errors()
        self._user, self._toml, self._dotenv = user, toml, dotenv
        if settings == self._global:
            return
        self._commit_global(settings)
        log.info("config.reloaded", generation=self.generation, files=[str(f) for f in self.files])
        self._notify(settings)

    async def _reload_project(self, root: Path) -> None:
        proj = self._projects.get(root)
        if proj is None:
            return
        try:
            proj.stamp = await anyio.to_thread.run_sync(_stamp, _project_files(root))
            layer = await anyio.to_thread.run_sync(read_settings_json, proj.file)
            dotenv = await anyio.to_thread.run_sync(
                dotenv_layer, _abs(Path(root) / ".qwen" / ".env"))
            settings = (
                build([self._user, layer, self._dotenv, dotenv, self._toml, self._env])
                if layer.data or dotenv.data
                else self.global_settings
            )
        except ConfigError as exc:
            self.project_errors[root] = str(exc)
            self._bad_edit(exc, project=root)
            return
        self.project_errors.pop(root, None)
        self._errors.pop(str(proj.file), None)
        proj.layer, proj.dotenv = layer, dotenv
        if settings == self._cache.get(root):
            return
        self._cache[root] = settings
        self.generation += 1
        log.info("config.project_reloaded", project=str(root), generation=self.generation)
        for cb in list(self._project_listeners):
            try:
                cb(root, settings)
            except Exception:
                log.exception("config.listener_failed", project=str(root))

    def _clear_global_errors(self) -> None:
        for f in (self.user_settings_file, self.config_file):
            self._errors.pop(str(f), None)

    def _bad_edit(self, exc: ConfigError, *, project: Path | None = None) -> None:
        self._errors.pop(exc.file, None)  # re-insert: last_error is the newest
        self._errors[exc.file] = str(exc)
        log.error(
            "config.reload_failed",
            file=exc.file,
            key=exc.key,
            problem=exc.problem,
            project=str(project) if project else None,
            keeping="last good configuration",
        )

    def _notify(self, settings: Settings) -> None:
        for cb in list(self._listeners):
            try:
                cb(settings)
            except Exception:
                log.exception("config.listener_failed")
