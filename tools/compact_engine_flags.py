"""Compact the tables `tools/record_engine_flags.py` writes into the ones the test suite reads
(tests/engine_flags/<engine>.json): every option string (aliases included) with whether it takes a
value, its choices and whether it is deprecated.

    python tools/compact_engine_flags.py vllm vllm-0.33.0.json tests/engine_flags/vllm.json
"""

import json
import sys


def compact(options: dict) -> dict:
    out = {}
    for flag, entry in options.items():
        for alias in entry.get("option_strings", [flag]):
            out[alias] = {"takes_value": bool(entry.get("takes_value", not entry.get("is_boolean_flag"))),
                          "choices": entry.get("choices"), "deprecated": bool(entry.get("deprecated"))}
    return dict(sorted(out.items()))


def main(engine: str, source: str, target: str) -> None:
    with open(source) as stream:
        recorded = json.load(stream)
    doc = {"engine": engine, "version": recorded["version"], "commit": recorded.get("commit"),
           "recorded_with": "tools/record_engine_flags.py", "options": compact(recorded["options"])}
    if "routers" in recorded:
        router = recorded["routers"]["sglang_router"]
        doc["router"] = {"command": "python3 -m sglang_router.launch_router", "version": router["version"], "options": compact(router["options"])}
    with open(target, "w") as f:
        json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:4])
