"""The one table of model families, kjit/model_families.json, that apply_to and kjit-tune --config
both read (issue 45, defect 8: kjit-tune took OLMo 2 and 3, gpt-oss and Helium for LLaMA-casting
models while apply_to ran Gemma's casting, and gave a llama config's final_logit_softcapping
soft-cap kernels that Hugging Face's llama never applies). kjit-tune embeds the file at build time:
the wheel's program must carry the very text the package reads, and apply_to's choices must be the
file's. tests/autotune/model_config_test.cc checks that the C++ reader gives each family what the
file says; tests/python/test_hf_families_cpu.py that each family's entry rounds as Hugging Face's
norms do."""

import json
import os
from pathlib import Path

import pytest

import kjit
from kjit import _capi

from conftest import needs_torch

TABLE = Path(kjit.__file__).resolve().parent / "model_families.json"


def _families() -> dict:
    return json.loads(TABLE.read_text(encoding="utf-8"))["families"]


def test_kjit_tune_embeds_the_table_the_package_reads():
    program = Path(os.environ.get("KJIT_TUNE_BIN") or _capi.NATIVE_DIR / "kjit-tune")
    if not program.is_file():
        pytest.skip(f"no kjit-tune program at {program} (the package is not a wheel install; "
                    "set KJIT_TUNE_BIN)")
    assert TABLE.read_bytes() in program.read_bytes(), \
        f"{program} embeds another model_families.json than {TABLE}"


@needs_torch
def test_apply_to_reads_the_same_table():
    from kjit.torch.integrations import hf
    families = _families()
    assert hf._SUPPORTED == {name: (f["norm_casting"], f.get("norm_weight_offset", 0.0))
                             for name, f in families.items()}
    assert set(hf._SOFTCAPPED) == {n for n, f in families.items() if f.get("softcaps_logits")}
    assert hf._LOGITS_DIVIDED_BY == {n: f["logits_divided_by"] for n, f in families.items()
                                     if "logits_divided_by" in f}
    assert set(hf._CONDITIONAL_CAUSAL_LM) == {n for n, f in families.items()
                                              if f.get("conditional_causal_lm")}


def test_the_families_kjit_tune_misread_are_gemma_casting_and_llama_is_not_softcapped():
    families = _families()
    for model_type in ("olmo2", "olmo3", "gpt_oss", "helium"):
        assert families[model_type]["norm_casting"] == "gemma", model_type
        assert families[model_type].get("norm_weight_offset", 0.0) == 0.0, model_type
    assert not families["llama"].get("softcaps_logits", False)
    assert families["gemma2"]["softcaps_logits"] and families["gemma2"]["norm_weight_offset"] == 1
