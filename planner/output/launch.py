"""Launch scripts that start as written: one bash script for every host of a plan.

The engine exporters (`planner/output/engines.py`) describe servers as data: the host they run on,
their command line as a list of words, the port of their health endpoint. This module writes them
into one script that an operator runs on each host with `--host NAME`:

- host addresses come from a hosts file (`NAME ADDRESS` per line); the script checks that every host
  of the plan has a well-formed address, and that the commands it needs exist, before starting anything;
- auxiliary files (expert maps, engine YAML) are written on every host, into the run directory;
- that host's servers start in the background with their output in `logs/`; the script waits for
  their health endpoints, and stops them all together when one exits or on Ctrl-C;
- `--smoke` starts the host's servers, waits until they are healthy and stops them (a start-up test).

Every word that reaches the shell is quoted with `shlex.quote`; a host address enters a word only as
a variable expansion inside double quotes, and file names made from user strings are sanitised.
"""

import re
import shlex
from dataclasses import dataclass, field

__all__ = ["HostRef", "LaunchScript", "Part", "RankRef", "Server", "render_script", "safe_file_name", "word"]

HOSTS_FILE_DEFAULT = "hosts.txt"
START_TIMEOUT_S_DEFAULT = 60 * 60  # a 600 GB checkpoint loads from network storage in tens of minutes


@dataclass(frozen=True)
class HostRef:
    """The address of a host of the plan, filled in at run time from the hosts file."""

    host: str


@dataclass(frozen=True)
class RankRef:
    """A number that depends on which host of a replica runs the command: `value` on this host, and
    `per_host` times the host's index in its replica (None when not a multiple), so that Kubernetes
    manifests can compute it from LWS_WORKER_INDEX."""

    value: int
    per_host: int | None = 1


Part = str | HostRef | RankRef
Word = tuple[Part, ...]


def word(*parts: Part | int) -> Word:
    """One command-line word made of literal text and host addresses, e.g. word(HostRef(h), ":", 8000)."""
    return tuple(p if isinstance(p, HostRef | RankRef) else str(p) for p in parts)


@dataclass
class Server:
    """One process to start on `host`: its command, and the port of its health endpoint (None for a
    worker that serves no HTTP, such as a headless data-parallel rank)."""

    host: str
    label: str
    argv: list[Word]
    port: int | None = None
    health_path: str = "/health"
    deployment: int = -1  # index of its deployment in the plan (-1: a router)
    replica: int = 0  # position of its replica in the deployment
    host_rank: int = 0  # position of its host in the replica


@dataclass
class LaunchScript:
    engine: str  # "vllm", "sglang", "trtllm"
    header: list[str]  # comment lines: what the script targets and assumes
    hosts: list[str]  # every host of the plan, in plan order
    servers: list[Server]
    files: dict[str, str] = field(default_factory=dict)  # run-directory file name -> content
    generated_files: dict[str, list[Word]] = field(default_factory=dict)  # files with host addresses: one word per line
    notes: list[str] = field(default_factory=list)  # what the engine cannot express, as # NOTE lines
    endpoints: dict[tuple[str, str], list[tuple[str, int, int | None]]] = field(default_factory=dict)  # (workload, role) -> (host, port, bootstrap port)


def safe_file_name(text: str) -> str:
    """A file name from a user string: letters, digits, dot, dash and underscore only."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._") or "unnamed"
    return name[:80]


def _comment(text: str) -> str:
    """A comment line that cannot end early: newlines and control characters become spaces."""
    return "# " + re.sub(r"[\x00-\x1f\x7f]", " ", text)


def _render_word(w: Word, variables: dict[str, str]) -> str:
    out = []
    for part in w:
        if isinstance(part, HostRef):
            out.append(f'"${{{variables[part.host]}}}"')
        elif isinstance(part, RankRef):
            out.append(str(part.value))
        elif part:
            out.append(shlex.quote(part))
    return "".join(out) or "''"


def _render_argv(argv: list[Word], variables: dict[str, str]) -> str:
    """The words of a command, a new continued line before each option so that a flag and its value share a line."""
    text = ""
    for w in argv:
        rendered = _render_word(w, variables)
        starts_option = isinstance(w[0], str) and w[0].startswith("-") and not w[0].lstrip("-").isdigit() if w else False
        text += (" \\\n            " if starts_option else " ") + rendered
    return text.lstrip()


def _commands_needed(servers: list[Server]) -> list[str]:
    """The executables a host's servers run (after `env` and its VAR=value words)."""
    needed = []
    for server in servers:
        words = ["".join(p for p in w if isinstance(p, str)) for w in server.argv]
        if words and words[0] == "env":
            words = [w for w in words[1:] if "=" not in w or w.startswith("-")]
        if words and words[0] not in needed:
            needed.append(words[0])
    return needed


_PREAMBLE = r'''set -euo pipefail
usage() {
    echo "usage: $0 --host NAME [--hosts FILE] [--run-dir DIR] [--smoke]"
    echo "  --host NAME    the host of the plan this machine is (see --list-hosts)"
    echo "  --hosts FILE   lines of 'NAME ADDRESS' for every host (default: \$PLANNER_HOSTS_FILE or hosts.txt next to this script)"
    echo "  --run-dir DIR  where files and logs go (default: \$PLANNER_RUN_DIR or ./planner-run)"
    echo "  --smoke        start this host's servers, wait until they are healthy, stop them, exit 0"
}
HOST=""
HOSTS_FILE="${PLANNER_HOSTS_FILE:-$(dirname "$0")/hosts.txt}"
RUN_DIR="${PLANNER_RUN_DIR:-$PWD/planner-run}"
SMOKE=0
while [ $# -gt 0 ]; do
    case "$1" in
        --host) HOST="${2:?--host needs a name}"; shift 2 ;;
        --hosts) HOSTS_FILE="${2:?--hosts needs a file}"; shift 2 ;;
        --run-dir) RUN_DIR="${2:?--run-dir needs a directory}"; shift 2 ;;
        --smoke) SMOKE=1; shift ;;
        --list-hosts) printf '%s\n' "${PLAN_HOSTS[@]}"; exit 0 ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; exit 2 ;;
    esac
done
[ -n "$HOST" ] || { usage >&2; exit 2; }
[ -r "$HOSTS_FILE" ] || { echo "hosts file $HOSTS_FILE not found: write one 'NAME ADDRESS' line per host (--list-hosts)" >&2; exit 2; }
declare -A ADDRESS=()
while read -r name address _; do
    case "$name" in ''|'#'*) continue ;; esac
    if ! [[ "$address" =~ ^[A-Za-z0-9._:-]+$ ]]; then
        echo "$HOSTS_FILE: address of $name is not a host name or IP address: '$address'" >&2; exit 2
    fi
    ADDRESS["$name"]="$address"
done < "$HOSTS_FILE"
missing=()
for name in "${PLAN_HOSTS[@]}"; do [ -n "${ADDRESS[$name]:-}" ] || missing+=("$name"); done
if [ ${#missing[@]} -gt 0 ]; then echo "$HOSTS_FILE has no address for: ${missing[*]}" >&2; exit 2; fi
'''

_RUNTIME = r'''PIDS=(); LABELS=(); PORTS=(); HEALTH=()
start() {  # label port health-path command...
    local label="$1" port="$2" health="$3"; shift 3
    echo "starting $label (log: $RUN_DIR/logs/$label.log)"
    "$@" > "logs/$label.log" 2>&1 &
    PIDS+=("$!"); LABELS+=("$label"); PORTS+=("$port"); HEALTH+=("$health")
}
stop_all() {
    trap - INT TERM EXIT
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
need() { for cmd in "$@"; do command -v "$cmd" > /dev/null || { echo "$cmd not found on $HOST: install it first" >&2; exit 2; }; done; }
wait_healthy() {
    local deadline=$((SECONDS + ${PLANNER_START_TIMEOUT_S:-__TIMEOUT__})) i
    for i in "${!PIDS[@]}"; do
        until [ -z "${PORTS[$i]}" ] || curl -sf "http://127.0.0.1:${PORTS[$i]}${HEALTH[$i]}" > /dev/null; do
            kill -0 "${PIDS[$i]}" 2> /dev/null || { echo "${LABELS[$i]} exited while starting; see $RUN_DIR/logs/${LABELS[$i]}.log" >&2; exit 1; }
            [ "$SECONDS" -lt "$deadline" ] || { echo "${LABELS[$i]} not healthy after ${PLANNER_START_TIMEOUT_S:-__TIMEOUT__} s" >&2; exit 1; }
            sleep 2
        done
    done
}
'''

_EPILOGUE = r'''if [ ${#PIDS[@]} -eq 0 ]; then echo "nothing to start on $HOST"; exit 0; fi
wait_healthy
echo "${#PIDS[@]} server(s) on $HOST are up; Ctrl-C stops them together"
if [ "$SMOKE" = 1 ]; then stop_all; exit 0; fi
wait -n || true
echo "a server on $HOST exited; stopping the others" >&2
exit 1
'''


def render_script(script: LaunchScript) -> str:
    """The bash text of `script` (see the module docstring)."""
    variables = {host: f"HOST_{i}" for i, host in enumerate(script.hosts)}
    lines = ["#!/usr/bin/env bash", *(_comment(h) for h in script.header), *(_comment(f"NOTE: {n}") for n in script.notes), ""]
    lines.append("PLAN_HOSTS=(" + " ".join(shlex.quote(h) for h in script.hosts) + ")")
    lines += [_PREAMBLE.rstrip("\n")]
    lines += [f"{variables[h]}=\"${{ADDRESS[{shlex.quote(h)}]}}\"" for h in script.hosts]
    lines += ['mkdir -p "$RUN_DIR/logs"', 'cd "$RUN_DIR"', ""]
    for name, text in script.files.items():
        end = "PLANNER_EOF"
        while end in text:  # the delimiter must not occur in the text, or the rest would run as commands
            end += "_"
        lines += [f"cat > {shlex.quote(safe_file_name(name))} <<'{end}'", text.rstrip("\n"), end]
    for name, rows in script.generated_files.items():
        lines.append("printf '%s\\n' \\\n    " + " \\\n    ".join(_render_word(w, variables) for w in rows) + f" > {shlex.quote(safe_file_name(name))}")
    lines += ["", _RUNTIME.replace("__TIMEOUT__", str(START_TIMEOUT_S_DEFAULT)).rstrip("\n"), "trap stop_all INT TERM EXIT", "",
              'case "$HOST" in']
    for host in script.hosts:
        here = [s for s in script.servers if s.host == host]
        lines.append(f"    {shlex.quote(host)})")
        if here:
            lines.append("        need curl " + " ".join(shlex.quote(c) for c in _commands_needed(here)))
        for s in here:
            argv = _render_argv(s.argv, variables)
            lines.append(f"        start {shlex.quote(safe_file_name(s.label))} {s.port if s.port else shlex.quote('')} "
                         f"{shlex.quote(s.health_path)} \\\n            {argv}")
        lines.append("        ;;")
    lines += ['    *) echo "$HOST is not a host of this plan (--list-hosts shows them)" >&2; exit 2 ;;', "esac", _EPILOGUE.rstrip("\n")]
    return "\n".join(lines) + "\n"
