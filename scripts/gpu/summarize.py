#!/usr/bin/env python3
"""The summary of one scripts/gpu/verify.sh run: reads the stages' reports in its log folder and
writes one JSON object, then prints it. Exit status 0 only when every stage asked for reported,
none failed and each passed something (one that only skipped proves nothing); a missing report
(a shard that crashed or ran out of time) counts as a failure.

    scripts/gpu/summarize.py --logs DIR --traces DIR --stages "cpp python" --wall-ms N --out F

Counts per stage:
  cpp        gtest's JSON of every shard and of the serial run: passed, failed, skipped tests;
  sanitizer  one check per compute-sanitizer run (its exit status: 0 clean, 3 errors found);
  python     pytest's JUnit XML;
  bench      one check per benchmark command (each checks its kernels before timing them).
From the stages' KJIT_TRACE files (kjit's "nvrtc <program>" compile spans): nvrtc_s, the seconds
during which at least one compile ran (the union of the spans: what a warm kernel cache saves at
most), and nvrtc_span_s, the spans' sum over every thread and process (the CPU time they asked for,
waits for a core included)."""

import argparse
import glob
import json
import os
import sys
import xml.etree.ElementTree as ET


def counts(passed=0, failed=0, skipped=0, failures=()):
    return {"passed": passed, "failed": failed, "skipped": skipped, "failures": list(failures)}


def gtest_counts(logs, prefix="cpp-"):
    """Every shard's and the serial run's gtest JSON; a log without its report is a failure,
    named with its exit status (a .rc file beside it)."""
    result = counts()
    for log in sorted(glob.glob(os.path.join(logs, f"{prefix}*.log"))):
        report = log[:-len(".log")] + ".json"
        try:
            with open(report) as f:
                suites = json.load(f)["testsuites"]
        except (OSError, ValueError, KeyError) as e:
            rc = read(log[:-len(".log")] + ".rc", "unknown")
            result["failed"] += 1
            result["failures"].append(f"{os.path.basename(log)}: exit {rc}, no gtest report ({e})")
            continue
        for suite in suites:
            for test in suite["testsuite"]:
                name = f"{suite['name']}.{test['name']}"
                if test.get("failures"):
                    result["failed"] += 1
                    result["failures"].append(name)
                elif test.get("result") == "SKIPPED":
                    result["skipped"] += 1
                elif test.get("status") == "RUN":
                    result["passed"] += 1
    return result


def exit_status_counts(logs, prefix):
    """One check per `<prefix>-*.rc` file (a command's exit status), named after the file."""
    result = counts()
    for rc_file in sorted(glob.glob(os.path.join(logs, f"{prefix}-*.rc"))):
        name = os.path.basename(rc_file)[:-len(".rc")]
        with open(rc_file) as f:
            rc = f.read().strip()
        if rc == "0":
            result["passed"] += 1
        else:
            result["failed"] += 1
            result["failures"].append(f"{name}: exit {rc or '(none)'}")
    if not result["passed"] and not result["failed"]:
        result["failed"] = 1
        result["failures"].append(f"no {prefix} ran")
    return result


def pytest_counts(logs):
    path = os.path.join(logs, "python-junit.xml")
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as e:
        return pytest_log_counts(logs, f"no pytest report ({e})")
    result = counts()
    for case in root.iter("testcase"):
        name = f"{case.get('classname')}.{case.get('name')}"
        if case.find("failure") is not None or case.find("error") is not None:
            result["failed"] += 1
            result["failures"].append(name)
        elif case.find("skipped") is not None:
            result["skipped"] += 1
        else:
            result["passed"] += 1
    return result


def pytest_log_counts(logs, why):
    """A pytest run cut off before its report: the verbose log's per-test lines ("[gw0] [ 3%]
    PASSED tests/python/x.py::test" or "tests/python/x.py::test PASSED [ 3%]") still tell what ran;
    the missing report itself counts as a failure."""
    keys = {"PASSED": "passed", "XPASS": "passed", "SKIPPED": "skipped", "XFAIL": "skipped",
            "FAILED": "failed", "ERROR": "failed"}
    outcomes = {}  # a test's last word: the short summary repeats failures
    for line in read(os.path.join(logs, "python.log")).splitlines():
        words = line.split()
        names = [w for w in words if "::" in w]
        found = [keys[w] for w in words[:5] if w in keys]
        if names and found:
            outcomes[names[0]] = found[0]
    result = counts(failed=1, failures=[why])
    for name, key in sorted(outcomes.items()):
        result[key] += 1
        if key == "failed":
            result["failures"].append(name)
    return result


def nvrtc_spans(trace_file):
    """The compile spans ("nvrtc <program>") of a KJIT_TRACE file, as (start, end) in seconds."""
    try:
        with open(trace_file) as f:
            events = json.load(f).get("traceEvents", [])
    except (OSError, ValueError):
        return []
    return [(e["ts"] / 1e6, (e["ts"] + e.get("dur", 0)) / 1e6) for e in events
            if e.get("ph") == "X" and str(e.get("name", "")).startswith("nvrtc ")]


def busy_seconds(spans):
    """How long at least one of the spans was running: the length of their union."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def read(path, default=""):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return default


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--logs", required=True)
    parser.add_argument("--traces", required=True)
    parser.add_argument("--stages", required=True, help="the stages asked for, space-separated")
    parser.add_argument("--wall-ms", type=int, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    by_stage = {"cpp": lambda: gtest_counts(args.logs),
                "sanitizer": lambda: exit_status_counts(args.logs, "sanitizer"),
                "python": lambda: pytest_counts(args.logs),
                "bench": lambda: exit_status_counts(args.logs, "bench")}
    stages, all_spans = {}, []
    for name in args.stages.split():
        if name not in by_stage:
            sys.exit(f"summarize: unknown stage {name!r} (expected one of {', '.join(by_stage)})")
        stage = by_stage[name]()
        timing = json.loads(read(os.path.join(args.logs, f"stage-{name}.json"), "{}") or "{}")
        stage["wall_s"] = timing.get("wall_s")
        if "rc" not in timing:
            stage["failed"] += 1
            stage["failures"].append("the stage did not finish")
        spans = [span for trace in glob.glob(os.path.join(args.traces, f"{name}*.json"))
                 for span in nvrtc_spans(trace)]
        stage["nvrtc_s"] = round(busy_seconds(spans), 1)
        stage["nvrtc_span_s"] = round(sum(b - a for a, b in spans), 1)
        stage["compiles"] = len(spans)
        all_spans += spans
        stages[name] = stage
    reruns = gtest_counts(args.logs, "rerun-cpp-")

    gpu = read(os.path.join(args.logs, "gpu.txt")).split(", ")
    summary = {
        "commit": read(".device-bundle/COMMIT", "unknown"),
        "device": gpu[0] if gpu else "unknown",
        "driver": gpu[1] if len(gpu) > 1 else "unknown",
        "wall_s": round(args.wall_ms / 1000, 1),
        "nvrtc_s": round(busy_seconds(all_spans), 1),
        "nvrtc_span_s": round(sum(b - a for a, b in all_spans), 1),
        "compiles": len(all_spans),
        "kernel_cache": read(os.path.join(args.logs, "cache.txt")).splitlines(),
        "stages": stages,
    }
    if reruns["passed"] or reruns["failed"]:
        summary["cpp_reruns_alone"] = reruns  # shards that crashed, run again alone (not counted)
    with open(args.out, "w") as f:
        json.dump(summary, f, indent=1)
        f.write("\n")
    print(json.dumps(summary, indent=1))
    # A stage whose every test skipped proves nothing: it fails too.
    ok = all(s["failed"] == 0 and s["passed"] > 0 for s in stages.values())
    print(f"verify: {'PASSED' if ok else 'FAILED'} in {summary['wall_s']} s "
          f"({summary['nvrtc_s']} s in NVRTC)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
