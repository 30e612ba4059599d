#!/usr/bin/env python3
"""Checks that every metric a Grafana dashboard queries exists on at least one /metrics page.

Usage: scripts/check-dashboard-metrics.py [--promtool PROMTOOL] DASHBOARD.json SCRAPE [SCRAPE...]

Reads every PromQL expression of the dashboard — the `expr` of each target of each panel
(rows and nested panels included) and the query of each Prometheus template variable — takes
the metric names out of it, and fails listing every name that none of the scrapes (Prometheus
text exposition files) has. A scrape provides each sample name it contains and, for each family
it declares with `# TYPE`, the series names of that type: a histogram F provides F_bucket, F_sum
and F_count (not F itself, which PromQL cannot select), a summary F, F_sum and F_count. Exits 0
when every name resolves, 1 when one does not, 2 on bad input. Standard library only.

With --promtool, every expression (Grafana variables replaced by a duration or ".*") is also
parsed by `promtool check rules`, as the expression of a recording rule, so that a PromQL syntax
error in a panel fails too.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

# PromQL words that look like metric names but are not.
KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
    "offset", "inf", "nan", "atan2",
}
IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def strip_expr(expr):
    """Removes everything of an expression that is not a metric name or a function name."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)  # strings
    expr = re.sub(r"\$\{[^}]*\}|\$\w+", " ", expr)             # Grafana variables
    expr = re.sub(r"\{[^{}]*\}", " ", expr)                    # label matchers
    expr = re.sub(r"\[[^\]]*\]", " ", expr)                    # ranges, subqueries
    # Label lists of grouping and vector matching: by (a, b), on(instance), group_left(node_id).
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    expr = re.sub(r"\boffset\s+\S+", " ", expr)
    return expr


def metric_names(expr):
    """The metric names an expression selects (identifiers that are neither functions nor
    keywords nor numbers)."""
    s = strip_expr(expr)
    names = set()
    for m in IDENT.finditer(s):
        word = m.group(0)
        if m.start() > 0 and (s[m.start() - 1].isdigit() or s[m.start() - 1] == "."):
            continue  # part of a number or a duration (1e3, 5m)
        rest = s[m.end():].lstrip()
        if rest.startswith("("):
            continue  # a function or an aggregation
        if word.lower() in KEYWORDS:
            continue
        names.add(word)
    return names


def variable_expr(var):
    """The PromQL inside a query-variable's query (label_values(EXPR, label) → EXPR), or None."""
    q = var.get("query")
    if isinstance(q, dict):
        q = q.get("query")
    if not isinstance(q, str) or not q.strip():
        return None
    m = re.fullmatch(r"\s*label_values\((.*),\s*[a-zA-Z_][a-zA-Z0-9_]*\s*\)\s*", q, re.S)
    if m:
        return m.group(1)
    m = re.fullmatch(r"\s*(?:query_result|metrics)\((.*)\)\s*", q, re.S)
    if m:
        return m.group(1)
    if re.fullmatch(r"\s*label_names\(\s*\)\s*", q):
        return None
    return q


def expressions(dashboard):
    """(where, expr) for every PromQL expression of the dashboard."""
    out = []

    def walk(panels):
        for p in panels or []:
            title = p.get("title") or f"panel {p.get('id')}"
            for t in p.get("targets") or []:
                if t.get("expr"):
                    out.append((f"panel '{title}' target {t.get('refId', '?')}", t["expr"]))
            walk(p.get("panels"))

    walk(dashboard.get("panels"))
    for row in dashboard.get("rows") or []:  # the pre-5.0 layout
        walk(row.get("panels"))
    for var in (dashboard.get("templating") or {}).get("list") or []:
        if var.get("type") == "query":
            e = variable_expr(var)
            if e:
                out.append((f"variable '{var.get('name')}'", e))
    return out


def scraped_names(path):
    """(series names the scrape provides, its histogram families)."""
    names, histograms = set(), set()
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            if line.startswith("#"):
                parts = line.split()
                if len(parts) >= 4 and parts[1] == "TYPE":
                    family, kind = parts[2], parts[3]
                    if kind == "histogram":
                        histograms.add(family)
                        names.update(family + s for s in ("_bucket", "_sum", "_count"))
                    elif kind == "summary":
                        names.update((family, family + "_sum", family + "_count"))
                    else:
                        names.add(family)
                continue
            m = IDENT.match(line)
            if m:
                names.add(m.group(0))
    return names, histograms


def concrete(expr):
    """The expression with Grafana's variables replaced: interval/range ones by a duration,
    the others (label values of the template variables) by the regex ".*"."""
    expr = re.sub(r"\$\{?__(rate_interval|interval|range)\}?", "5m", expr)
    return re.sub(r"\$\{[^}]*\}|\$\w+", ".*", expr)


def check_syntax(promtool, exprs):
    """Parses every expression with promtool (as recording rules); True when all parse."""
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:expr_{i}", "expr": concrete(e)} for i, (_, e) in enumerate(exprs)]}]}
    fd, path = tempfile.mkstemp(suffix=".rules.yml")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(rules, f, indent=1)  # JSON is YAML
        r = subprocess.run([promtool, "check", "rules", path], capture_output=True, text=True,
                           timeout=60)
    finally:
        os.unlink(path)
    if r.returncode != 0:
        print("check-dashboard-metrics: promtool cannot parse the dashboard's PromQL:\n"
              + r.stdout + r.stderr, file=sys.stderr)
        for i in sorted({int(n) for n in re.findall(r"dashboard:expr_(\d+)", r.stdout + r.stderr)}):
            print(f"  {exprs[i][0]}: {exprs[i][1]}", file=sys.stderr)
        return False
    return True


def main(argv):
    ap = argparse.ArgumentParser(description="Checks a Grafana dashboard's metric names "
                                 "against /metrics scrapes.")
    ap.add_argument("--promtool", help="also parse every expression with this promtool")
    ap.add_argument("dashboard")
    ap.add_argument("scrapes", nargs="+")
    args = ap.parse_args(argv[1:])
    try:
        with open(args.dashboard, encoding="utf-8") as f:
            dashboard = json.load(f)
    except (OSError, ValueError) as e:
        print(f"check-dashboard-metrics: {args.dashboard}: {e}", file=sys.stderr)
        return 2
    available, histograms = set(), set()
    for path in args.scrapes:
        names, hist = scraped_names(path)
        available |= names
        histograms |= hist
    exprs = expressions(dashboard)
    if not exprs:
        print(f"check-dashboard-metrics: {argv[1]} has no PromQL expressions", file=sys.stderr)
        return 1
    used = {}
    for where, expr in exprs:
        names = metric_names(expr)
        if not names:
            print(f"check-dashboard-metrics: {where}: no metric in {expr!r}", file=sys.stderr)
            return 1
        for n in names:
            places = used.setdefault(n, [])
            if where not in places:
                places.append(where)
    missing = sorted(n for n in used if n not in available)
    for n in missing:
        hint = " (a histogram: select its _bucket, _sum or _count)" if n in histograms else ""
        print(f"check-dashboard-metrics: {n} is on none of the scrapes{hint}; used by: "
              + "; ".join(used[n]), file=sys.stderr)
    if missing:
        return 1
    if args.promtool and not check_syntax(args.promtool, exprs):
        return 1
    print(f"[check-dashboard-metrics] {len(used)} metrics in {len(exprs)} expressions, "
          f"all on the scrapes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
