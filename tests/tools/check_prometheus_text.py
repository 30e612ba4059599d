#!/usr/bin/env python3
"""Strict check of a Prometheus text exposition (format 0.0.4) page, as fluxond serves it.

Usage: check_prometheus_text.py FILE   (exit 0: valid; 1: violations, printed one per line)

The page must parse with prometheus_client's own parser, and on top of that:
  - every family has exactly one "# HELP" and one "# TYPE" line, in that order, before its
    samples, and its samples are contiguous (no family appears twice);
  - every metric name starts with "fluxon_" (but for prometheus-cpp's own scrape statistics,
    LIBRARY_FAMILIES); counter families end in "_total";
  - histograms: per label set, "_bucket" samples in strictly increasing "le" order ending with
    le="+Inf", cumulative counts never decreasing, the +Inf bucket equal to "_count", and a
    non-negative "_sum";
  - the page ends with a newline.
"""
import math
import re
import sys

from prometheus_client.parser import text_string_to_metric_families

NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}
# The families prometheus-cpp's Exposer adds to every page it serves (its scrape statistics).
LIBRARY_FAMILIES = {"exposer_transferred_bytes_total", "exposer_scrapes_total",
                    "exposer_request_latencies"}


def family_of(sample_name, types):
    """The declared family a sample name belongs to, or None."""
    if sample_name in types:
        return sample_name
    for kind, suffixes in SUFFIXES.items():
        for suffix in suffixes:
            if sample_name.endswith(suffix):
                base = sample_name[: -len(suffix)]
                if types.get(base) == kind:
                    return base
    return None


def check(text):
    errors = []
    if not text.endswith("\n"):
        errors.append("page does not end with a newline")
    try:
        families = list(text_string_to_metric_families(text))
    except Exception as e:  # the parser raises ValueError and friends on malformed input
        return errors + [f"prometheus_client cannot parse the page: {e}"]

    helps, types, finished = {}, {}, set()
    current = None
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if line.startswith("# HELP "):
            name = line.split(" ", 3)[2]
            if name in helps:
                errors.append(f"line {lineno}: second HELP for {name}")
            if current is not None:
                finished.add(current)
            current = name
            helps[name] = True
            continue
        if line.startswith("# TYPE "):
            parts = line.split(" ")
            if len(parts) != 4:
                errors.append(f"line {lineno}: malformed TYPE line")
                continue
            name, kind = parts[2], parts[3]
            if name != current or name in types:
                errors.append(f"line {lineno}: TYPE {name} not right after its HELP")
            if kind not in ("counter", "gauge", "histogram", "summary", "untyped"):
                errors.append(f"line {lineno}: unknown type {kind}")
            if kind == "counter" and not name.endswith("_total"):
                errors.append(f"line {lineno}: counter {name} does not end in _total")
            types[name] = kind
            continue
        if line.startswith("#"):
            continue
        sample_name = re.split(r"[{ ]", line, maxsplit=1)[0]
        if not NAME.match(sample_name):
            errors.append(f"line {lineno}: bad metric name {sample_name!r}")
        family = family_of(sample_name, types)
        if not sample_name.startswith("fluxon_") and family not in LIBRARY_FAMILIES:
            errors.append(f"line {lineno}: {sample_name} lacks the fluxon_ prefix")
        if family is None:
            errors.append(f"line {lineno}: sample {sample_name} has no HELP/TYPE before it")
        elif family != current or family in finished:
            errors.append(f"line {lineno}: sample of {family} outside its family's block")

    for fam in families:
        if fam.type != "histogram":
            continue
        series = {}
        for s in fam.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
            entry = series.setdefault(labels, {"buckets": [], "sum": None, "count": None})
            if s.name.endswith("_bucket"):
                if "le" not in s.labels:
                    errors.append(f"{s.name}{labels}: bucket without le")
                    continue
                entry["buckets"].append((float(s.labels["le"]), s.value))
            elif s.name.endswith("_sum"):
                entry["sum"] = s.value
            elif s.name.endswith("_count"):
                entry["count"] = s.value
        for labels, entry in series.items():
            where = f"{fam.name}{dict(labels)}"
            buckets = entry["buckets"]
            if not buckets or not math.isinf(buckets[-1][0]):
                errors.append(f"{where}: no le=\"+Inf\" bucket last")
                continue
            for (le_a, c_a), (le_b, c_b) in zip(buckets, buckets[1:]):
                if not le_a < le_b:
                    errors.append(f"{where}: le {le_b} after {le_a}")
                if c_b < c_a:
                    errors.append(f"{where}: bucket le={le_b} ({c_b}) < le={le_a} ({c_a})")
            if entry["count"] is None or entry["sum"] is None:
                errors.append(f"{where}: missing _count or _sum")
                continue
            if buckets[-1][1] != entry["count"]:
                errors.append(f"{where}: +Inf bucket {buckets[-1][1]} != _count {entry['count']}")
            if entry["sum"] < 0:
                errors.append(f"{where}: negative _sum")
    return errors


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(sys.argv[1], encoding="utf-8") as f:
        errors = check(f.read())
    for e in errors:
        print(e)
    if not errors:
        print("ok")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
