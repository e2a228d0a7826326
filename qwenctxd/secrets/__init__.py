"""Secrets never leave where they live: one scanner for every memory write and every way out.

A shared low-level package (it imports nothing of the daemon): :mod:`.rules` is the rule table
(gitleaks ids), :mod:`.normalise` the views the scanner looks at (escapes decoded, NFKC, zero
width removed, lines joined, base64 decoded), :mod:`.scan` the scanner and redaction, and
:mod:`.stats` the process-wide counters ``daemon.status`` reports.
"""

from qwenctxd.secrets.rules import RULES, Rule
from qwenctxd.secrets.scan import Finding, Redaction, marker, redact, scan
from qwenctxd.secrets.stats import COUNTERS, Counters

__all__ = ["COUNTERS", "RULES", "Counters", "Finding", "Redaction", "Rule", "marker", "redact",
           "scan"]
