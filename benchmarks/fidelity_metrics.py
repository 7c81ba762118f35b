"""Latency metrics of the fidelity benchmark: how a row's measured time (TTFT, TPOT, tokens/s per user,
a static batch's end-to-end latency) is read from a `planner estimate --json` record.

A row names its metric in `measured_unit`:
  ttft_s                         time to first token. `planner_mode` static: the batch's prefill,
                                 B x ISL / prefill-only rate (every first token of a static batch
                                 comes when the whole batch is prefilled). Otherwise by
                                 `planner_arrivals`: closed (a fixed number of requests in flight):
                                 alone (batch 1) a request waits for nothing, ttft_s - queue_wait_s;
                                 with others decoding, it is sent when the one before it leaves, just
                                 as the next step starts, and waits that whole step: ttft_s +
                                 queue_wait_s (queue_wait_s is half a step); poisson (a request
                                 rate) with ttft_s, or
                                 ttft_p90_s where `measured_statistic` is p90 (ttft_s where the JSON
                                 has no ttft_p90_s; the row's `compared` column says which).
  tpot_s                         time per output token: tpot_s.
  output_tokens_per_s_per_user   1 / tpot_s.
  request_latency_s              a static batch end to end:
                                 B x ISL / prefill-only rate + OSL x B / decode-only rate.
Rows carrying a flag of SKIP_FLAGS stay in the CSV and are reported as skipped with its reason.
"""

LATENCY_UNITS = ("ttft_s", "tpot_s", "output_tokens_per_s_per_user", "request_latency_s")

SKIP_FLAGS = {
    "isl_unpublished": "mean prompt length not published by the benchmark's owner",
    "weights_offloaded": "weights offloaded to host memory, which the planner does not model",
    "model_unknown": "model not in the planner's catalog",
    "p99_only": "only a p99 is published; not compared with a mean",
}


def field(record: dict, key: str, bound: str) -> float | None:
    """`record[key]`, or an end of `record[key + '_range']` ([low, high] or {low|lo|min, high|hi|max})."""
    if bound == "mid":
        return record[key]
    span = record.get(key + "_range")
    if span is None:
        return None
    if isinstance(span, dict):
        names = ("low", "lo", "min") if bound == "low" else ("high", "hi", "max")
        return next((float(span[n]) for n in names if n in span), None)
    return float(span[0] if bound == "low" else span[1])


def skip_reason(row: dict) -> str | None:
    """Why the row is not evaluated (its flags that name a missing planner feature or fact), or None."""
    flags = [f for f in (row.get("mapping_flags") or "").split(";") if f in SKIP_FLAGS]
    return "; ".join(SKIP_FLAGS[f] for f in flags) or None


def static_time_s(record: dict, bound: str) -> float | None:
    """Static batching: B prompts prefilled back to back, then OSL decode steps at batch B."""
    batch, isl, osl = record["batch_per_replica"], record["input_tokens"], record["output_tokens"]
    prefill_rate = field(record, "prefill_only_tokens_per_s_per_replica", bound)
    decode_rate = field(record, "decode_only_tokens_per_s_per_replica", bound)
    if prefill_rate is None or decode_rate is None:
        return None
    return batch * isl / prefill_rate + osl * batch / decode_rate


def compared_key(row: dict, record: dict) -> str:
    """The JSON figure a latency row is compared with (the formula, for the report)."""
    unit = row["measured_unit"]
    if unit == "tpot_s":
        return "tpot_s"
    if unit == "output_tokens_per_s_per_user":
        return "1 / tpot_s"
    if unit == "request_latency_s":
        return "static batch time"
    if row["planner_mode"] == "static":
        return "static batch prefill"
    arrivals = row.get("planner_arrivals", "")
    if arrivals == "closed":
        return "ttft_s - queue_wait_s" if _alone(record) else "ttft_s + queue_wait_s"
    if arrivals == "poisson":
        return "ttft_p90_s" if row.get("measured_statistic") == "p90" and "ttft_p90_s" in record else "ttft_s"
    raise ValueError(f"{row['id']}: a TTFT row needs planner_arrivals closed or poisson, not {arrivals!r}")


def latency_metric(row: dict, record: dict, bound: str = "mid") -> float | None:
    """The row's measured time (or tokens/s per user) as the planner predicts it, or an end of its range."""
    key = compared_key(row, record)
    if key in ("tpot_s", "ttft_s", "ttft_p90_s"):
        return field(record, key, bound)
    if key == "1 / tpot_s":
        tpot = field(record, "tpot_s", bound)
        return None if tpot is None else 1.0 / tpot
    if key == "static batch time":
        return static_time_s(record, bound)
    if key == "static batch prefill":
        rate = field(record, "prefill_only_tokens_per_s_per_replica", bound)
        return None if rate is None else record["batch_per_replica"] * record["input_tokens"] / rate
    total = field(record, "ttft_s", bound)  # closed arrivals: no wait alone, a whole step behind others
    return None if total is None else total + (-1 if _alone(record) else 1) * record["queue_wait_s"]


def _alone(record: dict) -> bool:
    """A closed-loop request with nothing else in flight: batch 1, or a prefill replica's own pass."""
    return record["batch_per_replica"] <= 1 or record.get("role") == "prefill"
