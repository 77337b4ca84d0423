"""`python -m kjit.bench`'s command line and its out-of-memory rows without a GPU: the cases are
parsed before any GPU work (a typo in the last --case must not cost the run before it), and an
implementation that runs out of memory becomes a row instead of ending the run (the lce case at
131072 rows counts on it). The timings themselves need a GPU: run the benchmark there."""

import pytest

from conftest import needs_torch

pytestmark = needs_torch

try:
    import torch
    from kjit.bench import benchmark as bench
except ImportError:
    pass


@pytest.mark.parametrize("case, expected", [
    ("lce:131072x4096x128256", ("lce", (131072, 4096, 128256))),
    ("ce:16384x128256", ("ce", (16384, 128256))),
    ("norm:256x4096", ("norm", (256, 4096))),
    ("rl:8192x4096x151936", ("rl", (8192, 4096, 151936))),
    ("rl-logits:16384x151936", ("rl-logits", (16384, 151936))),
])
def test_cases_parse_into_their_sizes(case, expected):
    assert bench.parse_case(case) == expected


def test_default_cases_parse_and_include_the_fused_lm_head():
    assert [bench.parse_case(c)[0] for c in bench.DEFAULT_CASES].count("lce") == 1


@pytest.mark.parametrize("case", ["lce:8192x4096", "ce:16384x128256x2", "lce:0x4096x128256",
                                  "lce:8kx4096x128256", "mm:8x8", "lce"])
def test_a_bad_case_is_a_usage_error_before_the_gpu_is_looked_for(case, capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--case", "ce:256x128256", "--case", case])
    assert e.value.code == 2  # (without a GPU, a run that got further would return 1)
    err = capsys.readouterr().err
    assert f"--case {case}: expected one of" in err and "lce:ROWSxHIDDENxVOCAB" in err


def test_help_documents_every_case(capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for kind, shape in bench.CASE_SHAPES.items():
        assert f"{kind}:{shape}" in out


def test_out_of_memory_is_a_row_and_the_run_goes_on():
    def eager_at_131072_rows():
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 62.62 GiB. GPU 0 "
                                          "has a total capacity of 139.81 GiB")

    row = bench.lce_row("torch eager (.float() logits)", eager_at_131072_rows, 5, 1e15)
    assert row["impl"] == "torch eager (.float() logits)" and row["out_of_memory"] is True
    assert row["bytes_asked"] == int(62.62 * 2**30)
    assert "Tried to allocate 62.62 GiB" in row["error"] and "ms" not in row


def test_out_of_memory_without_a_size_in_the_message():
    row = bench.out_of_memory_row("x", torch.cuda.OutOfMemoryError("CUDA out of memory."))
    assert row["out_of_memory"] is True and row["bytes_asked"] is None
