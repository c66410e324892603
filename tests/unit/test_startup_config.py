"""Start-up translation and refusal, through vLLM's own config path (no engine).

`{"method": "selfspec"}` must work from `--speculative-config`, `LLM(...)`
(EngineArgs) and AsyncEngineArgs; bad input must fail before any engine process
starts, with a one-line message naming the problem.
"""

import json

import pytest

from vllm_selfspec.methods import DRAFTER_CLASS, PLUGIN_KEY, SelfSpecConfigError
from vllm_selfspec.proposers.artifacts import ModelStamp
from vllm_selfspec.proposers.resolved import ArtifactRefs


def _config(model_path, spec, cls=None, **kw):
    from vllm.engine.arg_utils import EngineArgs

    cls = cls or EngineArgs
    args = cls(model=model_path, dtype="float32", max_model_len=1024,
               kv_cache_memory_bytes=1 << 28, speculative_config=spec, **kw)
    return args.create_engine_config()


def test_llm_style_engine_args(model_path):
    cfg = _config(model_path, {"method": "selfspec", "draft_exit_threshold": 0.5})
    sc = cfg.speculative_config
    assert sc.method == "custom_class" and sc.model == DRAFTER_CLASS
    assert sc.num_speculative_tokens == 12  # per-method default
    opts = cfg.additional_config[PLUGIN_KEY]
    assert opts["method"] == "selfspec" and opts["draft_exit_threshold"] == 0.5
    assert opts["writes_target_kv"] and cfg.num_lookahead_tokens == 12  # P2
    refs = ArtifactRefs.from_json(opts["artifacts"])  # what the workers load
    assert refs.skip_mask.source.startswith("uniform")
    assert refs.model.num_layers == 30 and refs.model.fingerprint
    assert refs.bigram_table is refs.datastore is refs.checkpoint is refs.draft_vocab is None


def test_a_cached_mask_is_used_only_for_the_draft_weights_it_was_searched_for(
        model_path, tmp_path, monkeypatch):
    """A searched mask cached for this model (tools/search_mask.py --install) records the
    draft_weights its search scored; an engine drafting through other weights uses the
    uniform mask instead (a mask searched for the full-precision pass skips what a low-bit
    pass need not)."""
    from vllm_selfspec.model_info import stamp_from_path
    from vllm_selfspec.proposers.artifacts import artifact_path

    monkeypatch.setenv("VLLM_SELFSPEC_CACHE", str(tmp_path))
    stamp = stamp_from_path(model_path)
    dest = artifact_path("masks", stamp)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps({"attention": [3], "mlp": [5], "metadata": {
        "model": stamp.to_json(), "draft_weights": "full"}}))
    full = _config(model_path, {"method": "selfspec", "draft_weights": "full"})
    assert full.additional_config[PLUGIN_KEY]["artifacts"]["skip_mask"]["attention"] == [3]
    low = _config(model_path, {"method": "selfspec", "draft_weights": "w8a8"})
    mask = low.additional_config[PLUGIN_KEY]["artifacts"]["skip_mask"]
    assert mask["source"].startswith("uniform") and mask["attention"] == []


def test_w8a8_draft_weights_get_activation_scales_once(model_path, tmp_path, monkeypatch):
    """Key smoothing (default 0.5) with w8a8 draft weights: the activation scales are
    measured at the first start-up, cached for these weights and reused; no scales where no
    kernel quantizes activations (int8, full) or with smoothing 0; a cached file that
    cannot be used is measured again."""
    import os

    from vllm_selfspec.builders.activation_scales import load_scales, save_scales
    from vllm_selfspec.model_info import stamp_from_path
    from vllm_selfspec.proposers.artifacts import artifact_path

    monkeypatch.setenv("VLLM_SELFSPEC_CACHE", str(tmp_path))
    refs = ArtifactRefs.from_json(_config(model_path, {"method": "selfspec"})
                                  .additional_config[PLUGIN_KEY]["artifacts"])
    stamp = stamp_from_path(model_path)
    path = artifact_path("activation_scales", stamp)
    assert refs.activation_scales == str(path)
    scales = load_scales(path, stamp)
    assert scales["model.layers.0.self_attn.qkv_proj"].shape == (576,)
    assert scales["model.layers.29.mlp.down_proj"].shape == (1536,) and "lm_head" in scales
    built = os.stat(path).st_mtime_ns
    # (ngrammys-selfspec without its datastore, which would be built into this empty cache)
    for spec in ({"method": "swift"}, {"method": "layerskip"},
                 {"method": "ngrammys-selfspec", "datastore": "none"}):
        cfg = _config(model_path, spec)
        assert cfg.additional_config[PLUGIN_KEY]["artifacts"]["activation_scales"] == str(path)
    assert os.stat(path).st_mtime_ns == built  # cached, not measured again
    for spec in ({"draft_weights": "int8"}, {"draft_weights": "full"}, {"smoothing": 0.0}):
        cfg = _config(model_path, {"method": "selfspec", **spec})
        assert "activation_scales" not in cfg.additional_config[PLUGIN_KEY]["artifacts"]
    # the plugin's own cache entry stamped for other weights (or unreadable): measured again
    other = ModelStamp(stamp.architecture, stamp.num_layers, stamp.hidden_size,
                       stamp.vocab_size, "0" * len(stamp.fingerprint))
    save_scales(path, scales, other, {})
    _config(model_path, {"method": "selfspec"})
    assert load_scales(path, stamp)["lm_head"].shape == (576,)


def test_async_engine_args_and_cli_flag(model_path):
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    cfg = _config(model_path, {"method": "draft_verify", "num_speculative_tokens": 5},
                  cls=AsyncEngineArgs)
    assert cfg.speculative_config.num_speculative_tokens == 5
    parser = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())
    ns = parser.parse_args(["--model", model_path, "--dtype", "float32", "--max-model-len", "1024",
                            "--kv-cache-memory-bytes", str(1 << 28), "--speculative-config",
                            json.dumps({"method": "selfspec", "skip_mask": {"attention": [3]}})])
    cfg = AsyncEngineArgs.from_cli_args(ns).create_engine_config()
    assert cfg.additional_config[PLUGIN_KEY]["artifacts"]["skip_mask"]["attention"] == [3]


def test_other_methods_untouched(model_path):
    cfg = _config(model_path, {"method": "ngram", "num_speculative_tokens": 3,
                               "prompt_lookup_max": 3})
    assert cfg.speculative_config.method == "ngram"
    assert PLUGIN_KEY not in (cfg.additional_config or {})
    assert cfg.num_lookahead_tokens == 0


def _one_line_error(model_path, spec, match, **kw):
    with pytest.raises(SelfSpecConfigError, match=match) as e:
        _config(model_path, spec, **kw)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_unknown_key(model_path):
    _one_line_error(model_path, {"method": "selfspec", "skip_layer": [1]},
                    "unknown key 'skip_layer' for method 'selfspec'. Valid keys: .*skip_mask")


def test_unknown_method_lists_names(model_path):
    _one_line_error(model_path, {"method": "selfspek"},
                    "unknown speculative method 'selfspek'. vllm_selfspec methods: selfspec")


def test_mask_layer_out_of_range(model_path):
    _one_line_error(model_path, {"method": "selfspec", "skip_mask": {"attention": [30], "mlp": []}},
                    "attention layer 30 is out of range; this model has 30 layers")


def test_mask_for_another_model(model_path, tmp_path):
    other = ModelStamp("LlamaForCausalLM", 30, 576, 49152, "0123456789abcdef", "other-model")
    f = tmp_path / "mask.json"
    f.write_text(json.dumps({"attention": [3], "mlp": [], "metadata": {"model": other.to_json()}}))
    msg = _one_line_error(model_path, {"method": "selfspec", "skip_mask": str(f)},
                          "was made for another model")
    assert "weights fingerprint" in msg and "Use a mask made for this model" in msg


def test_pipeline_parallel_refused(model_path):
    _one_line_error(model_path, {"method": "selfspec"}, "pipeline parallelism "
                    r"\(pipeline_parallel_size=2\)", pipeline_parallel_size=2,
                    distributed_executor_backend="mp")


def test_lora_refused(model_path):
    _one_line_error(model_path, {"method": "selfspec"}, "does not support LoRA", enable_lora=True)


def test_spec_method_flag(model_path):
    from vllm.engine.arg_utils import EngineArgs

    args = EngineArgs(model=model_path, dtype="float32", max_model_len=1024,
                      kv_cache_memory_bytes=1 << 28, spec_method="selfspec", spec_tokens=4)
    cfg = args.create_engine_config()
    assert cfg.speculative_config.model == DRAFTER_CLASS
    assert cfg.speculative_config.num_speculative_tokens == 4


def test_ngrammys_config_finds_or_builds_table(model_path):
    cfg = _config(model_path, {"method": "ngrammys"})
    sc = cfg.speculative_config
    assert sc.model == DRAFTER_CLASS and sc.num_speculative_tokens >= 1
    opts = cfg.additional_config[PLUGIN_KEY]
    assert opts["method"] == "ngrammys"
    assert opts["artifacts"]["bigram_table"].endswith(".safetensors")
    assert not opts["writes_target_kv"] and cfg.num_lookahead_tokens == 0


def test_bigram_table_for_another_model(model_path, tmp_path):
    import numpy as np

    from vllm_selfspec.proposers.ngram_tables import BigramTable

    v = 49152
    ids = np.zeros((v, 2), dtype=np.int32)
    other = ModelStamp("LlamaForCausalLM", 30, 576, v, "0123456789abcdef", "other-model")
    f = tmp_path / "t.safetensors"
    BigramTable(ids, np.zeros((v, 2), np.float32), np.arange(4, dtype=np.int32),
                np.zeros((v, 2, 0), np.int32), other).save(f)
    msg = _one_line_error(model_path, {"method": "ngrammys", "bigram_table": str(f)},
                          "bigram table .* was made for another model")
    assert "tools/build_bigram.py" in msg


def test_datastore_missing_or_for_another_model(model_path, tmp_path):
    """ngrammys-history's ``datastore``: a path that does not exist (or a misspelt
    "sharegpt") and a file stamped for other weights are refused in one line."""
    import numpy as np

    from vllm_selfspec.proposers.datastore import Datastore

    msg = _one_line_error(model_path, {"method": "ngrammys-history", "bigram_table": "none",
                                       "datastore": "sharegtp"},
                          "datastore sharegtp does not exist")
    assert "tools/build_datastore.py" in msg and '"sharegpt"' in msg and '"none"' in msg
    other = ModelStamp("LlamaForCausalLM", 30, 576, 49152, "0123456789abcdef", "other-model")
    f = tmp_path / "d.safetensors"
    Datastore(np.arange(10, dtype=np.int32), other).save(f)
    _one_line_error(model_path, {"method": "ngrammys", "bigram_table": "none",
                                 "datastore": str(f)}, "datastore .* was made for another model")


@pytest.mark.parametrize("spec, match", [
    ({"selection": "best"}, "key 'selection' of method 'ngrammys' must be one of 'first', "
                            "'likelihood'"),
    ({"num_rows": 0}, r"key 'num_rows' of method 'ngrammys' must be an integer in \[1, 64\]"),
    ({"query_length": 1, "min_query_length": 2}, "min_query_length .* must not exceed"),
    ({"skip_mask": {"attention": []}}, "unknown key 'skip_mask' for method 'ngrammys'"),
    ({"bigram_table": "/nonexistent.safetensors"}, "bigram table /nonexistent.safetensors does "
                                                   "not exist"),
])
def test_ngrammys_bad_keys(model_path, spec, match):
    _one_line_error(model_path, {"method": "ngrammys", **spec}, match)


def test_layerskip_exit_layer_default_and_mask(model_path):
    """LayerSkip §4.2: the draft is layers 0..E-1 + final norm + LM head, i.e. a skip
    mask over every sub-layer from E on. Without exit_layer the proposer chooses E while
    serving (the key stays unset), starting from a quarter of the depth."""
    cfg = _config(model_path, {"method": "layerskip"})
    assert cfg.speculative_config.num_speculative_tokens == 6
    opts = cfg.additional_config[PLUGIN_KEY]
    assert opts["method"] == "layerskip" and opts["exit_layer"] is None
    mask = opts["artifacts"]["skip_mask"]
    assert mask["attention"] == list(range(8, 30)) == mask["mlp"]
    assert opts["writes_target_kv"] and cfg.num_lookahead_tokens == 6
    full = _config(model_path, {"method": "early_exit", "exit_layer": 30})
    assert full.additional_config[PLUGIN_KEY]["artifacts"]["skip_mask"]["attention"] == []


@pytest.mark.parametrize("spec, match", [
    ({"exit_layer": 31}, r"layerskip exit_layer must be an integer in \[1, 30\] for this "
                         "30-layer model"),
    ({"exit_layer": 0}, r"key 'exit_layer' of method 'layerskip' must be an integer in \[1, inf\]"),
    ({"stop_threshold": 1.5}, r"key 'stop_threshold' of method 'layerskip'"),
    ({"skip_mask": {"attention": [3]}}, "unknown key 'skip_mask' for method 'layerskip'"),
])
def test_layerskip_bad_keys(model_path, spec, match):
    _one_line_error(model_path, {"method": "layerskip", **spec}, match)


@pytest.fixture(scope="module")
def chimera_checkpoints(tmp_path_factory, model_path):
    """An (untrained) Chimera checkpoint stamped for the embedded model, and one stamped
    for another model."""
    from transformers import AutoConfig

    from vllm_selfspec.model_info import stamp_from_path
    from vllm_selfspec.proposers.chimera import (
        ChimeraConfig,
        ChimeraDraftModel,
        save_checkpoint,
    )
    from vllm_selfspec.proposers.draft_vocab import DraftVocab

    d = tmp_path_factory.mktemp("chimera")
    cfg = ChimeraConfig.from_hf(AutoConfig.from_pretrained(model_path), num_heads=3,
                                draft_vocab_size=64)
    model = ChimeraDraftModel(cfg, DraftVocab(__import__("torch").arange(64), cfg.vocab_size))
    stamp = stamp_from_path(model_path)
    ours, theirs = d / "ours.safetensors", d / "theirs.safetensors"
    save_checkpoint(ours, model, stamp, {"answer_tokens": 0})
    other = ModelStamp(stamp.architecture, stamp.num_layers, stamp.hidden_size, stamp.vocab_size,
                       "0123456789abcdef", name="another-model")
    save_checkpoint(theirs, model, other, {"answer_tokens": 0})
    return ours, theirs


def test_chimera_takes_its_draft_length_from_the_checkpoint(model_path, chimera_checkpoints):
    ours, _ = chimera_checkpoints
    cfg = _config(model_path, {"method": "chimera", "checkpoint": str(ours)})
    assert cfg.speculative_config.num_speculative_tokens == 3  # the checkpoint's heads
    opts = cfg.additional_config[PLUGIN_KEY]
    assert opts["artifacts"]["checkpoint"] == str(ours) and not opts["writes_target_kv"]
    assert cfg.num_lookahead_tokens == 0  # drafts write no KV
    cfg = _config(model_path, {"method": "chimera", "checkpoint": str(ours),
                               "num_speculative_tokens": 2})
    assert cfg.speculative_config.num_speculative_tokens == 2


@pytest.mark.parametrize("spec, match", [
    ({"checkpoint": "THEIRS"}, r"Chimera checkpoint .* was made for another model "
                               r"\(another-model: .*weights 0123456789abcdef"),
    ({"checkpoint": "/nonexistent/c.safetensors"},
     r"Chimera checkpoint /nonexistent/c.safetensors does not exist. Train one"),
    ({"checkpoint": "OURS", "num_speculative_tokens": 5},
     r"num_speculative_tokens=5 exceeds the 3 decoding heads"),
    ({"checkpoint": "OURS", "tensor_parallel_size": 2}, None),
])
def test_chimera_refusals(model_path, chimera_checkpoints, spec, match):
    ours, theirs = chimera_checkpoints
    spec = {k: {"OURS": str(ours), "THEIRS": str(theirs)}.get(v, v) if isinstance(v, str) else v
            for k, v in spec.items()}
    tp = spec.pop("tensor_parallel_size", None)
    if tp is not None:
        _one_line_error(model_path, {"method": "chimera", **spec},
                        r"method 'chimera' does not support tensor parallelism",
                        tensor_parallel_size=tp)
        return
    _one_line_error(model_path, {"method": "chimera", **spec}, match)


# ---- refusals scoped to what each guard protects (vllm_selfspec/guards.py) ----------

MIXED = {"layer_types": ["full_attention", "sliding_attention"] * 15, "sliding_window": 256}


def test_mixed_attention_refuses_layer_skip_but_not_ngrammys(model_path):
    """A model vLLM's own `ngram` runs (layers mixing attention kinds: more than one
    KV-cache group) runs `ngrammys` too; methods that draft through the target's layers
    and KV cache are refused in one line."""
    cfg = _config(model_path, {"method": "ngrammys"}, hf_overrides=MIXED)
    assert cfg.speculative_config.model == DRAFTER_CLASS
    assert cfg.additional_config[PLUGIN_KEY]["method"] == "ngrammys"
    for method in ("selfspec", "layerskip"):
        msg = _one_line_error(model_path, {"method": method}, hf_overrides=MIXED,
                              match=r"models mixing attention kinds \['full_attention', "
                                    r"'sliding_attention'\] \(more than one KV-cache group\)")
        assert "or method 'ngrammys'" in msg


def _guard(method_name, engine=None, model=None, parallel=None, core=None, opts=None):
    """check_supported on plain namespaces (no vLLM config): the guard alone."""
    from types import SimpleNamespace as NS

    from vllm_selfspec import methods
    from vllm_selfspec.guards import check_supported
    from vllm_selfspec.plugin import proposer_class

    method = methods.METHODS[method_name]
    hf = NS(architectures=["LlamaForCausalLM"], layer_types=None)
    model_cfg = NS(hf_config=hf, is_multimodal_model=False, use_mla=False, is_hybrid=False,
                   has_inner_state=False)
    for k, v in (model or {}).items():
        setattr(hf if k in ("architectures", "layer_types") else model_cfg, k, v)
    engine_args = NS(**{"enable_lora": False, "kv_transfer_config": None,
                        "speculative_config": {}, "async_scheduling": None,
                        "watermark_config": None, "attention_config": None, **(engine or {})})
    par = NS(**{"pipeline_parallel_size": 1, "tensor_parallel_size": 1, **(parallel or {})})
    check_supported(method, engine_args, model_cfg, par, proposer_class(method), core, opts)


def test_low_bit_draft_weights_are_refused_on_a_quantized_model():
    for method in ("selfspec", "swift", "layerskip"):
        with pytest.raises(SelfSpecConfigError, match="draft_weights='int8' on a quantized "
                           "model \\(quantization='awq'\\)") as e:
            _guard(method, model={"quantization": "awq"}, opts={"draft_weights": "int8"})
        assert 'use draft_weights "full"' in str(e.value) and "\n" not in str(e.value)
        _guard(method, model={"quantization": "awq"}, opts={"draft_weights": "full"})
        _guard(method, model={"quantization": None}, opts={"draft_weights": "int8"})


GUARDS = {  # feature -> (guard arguments, message fragment, methods it refuses)
    "pp": (dict(parallel={"pipeline_parallel_size": 2}), "pipeline parallelism", "all"),
    "async": (dict(engine={"async_scheduling": True}), "async scheduling", "all"),
    "block": (dict(core={"rejection_sample_method": "block"}),
              "rejection_sample_method='block'", "all"),
    "lora": (dict(engine={"enable_lora": True}), "LoRA", "reads"),
    "kv_connector": (dict(engine={"kv_transfer_config": object()}), "KV connectors", "reads"),
    "multimodal": (dict(model={"is_multimodal_model": True}), "multimodal models", "reads"),
    "arch": (dict(model={"architectures": ["GPT2LMHeadModel"]}),
             "architecture GPT2LMHeadModel", "reads"),
    "mla": (dict(model={"use_mla": True}), "MLA attention", "layers"),
    "hybrid": (dict(model={"is_hybrid": True}), "hybrid/recurrent models", "layers"),
    "recurrent": (dict(model={"has_inner_state": True}), "hybrid/recurrent models", "layers"),
    "mixed": (dict(model={"layer_types": ["full_attention", "chunked_attention"]}),
              "mixing attention kinds", "layers"),
    "tp": (dict(parallel={"tensor_parallel_size": 2}), "tensor parallelism", "states"),
}
SCOPE = {  # which methods each scope covers, by the proposer's flags
    "all": {"selfspec", "swift", "layerskip", "ngrammys", "ngrammys-history", "chimera",
            "ngrammys-chimera", "ngrammys-selfspec"},
    "reads": {"selfspec", "swift", "layerskip", "chimera", "ngrammys-chimera",
              "ngrammys-selfspec"},
    "layers": {"selfspec", "swift", "layerskip", "ngrammys-selfspec"},
    "states": {"chimera", "ngrammys-chimera"},
}


@pytest.mark.parametrize("feature", list(GUARDS))
@pytest.mark.parametrize("method", sorted(SCOPE["all"]))
def test_each_guard_refuses_only_the_methods_it_protects(method, feature):
    kwargs, fragment, scope = GUARDS[feature]
    if method not in SCOPE[scope]:
        _guard(method, **kwargs)  # e.g. ngrammys on a hybrid or MLA model: runs
        return
    with pytest.raises(SelfSpecConfigError, match=f"method '{method}' does not support") as e:
        _guard(method, **kwargs)
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_plain_model_passes_every_guard():
    for method in SCOPE["all"]:
        _guard(method)


@pytest.mark.parametrize("value", ["synthetic", "block", "fly"])
def test_only_the_lossless_rejection_sampler(model_path, value):
    """vLLM 0.32 offers 'synthetic' (ignores the drafts) and 'block' (Model Runner V2
    only), 0.33 adds the lossy 'fly': every method keeps to 'standard'."""
    msg = _one_line_error(model_path, {"method": "ngrammys", "rejection_sample_method": value},
                          f"does not support rejection_sample_method='{value}'")
    assert "use 'standard' (the default)" in msg
    cfg = _config(model_path, {"method": "selfspec", "rejection_sample_method": "standard"})
    assert cfg.speculative_config.rejection_sample_method == "standard"


def test_model_runner_v2_forced_is_refused(model_path, monkeypatch):
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    msg = _one_line_error(model_path, {"method": "ngrammys"},
                          r"does not support Model Runner V2 \(forced by "
                          r"VLLM_USE_V2_MODEL_RUNNER=1\)")
    assert "run on the V1 model runner; unset VLLM_USE_V2_MODEL_RUNNER" in msg
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    assert _config(model_path, {"method": "selfspec"}).speculative_config.model == DRAFTER_CLASS
    # unset: vLLM picks V1 itself (custom_class, or no Triton on CPU); not refused
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER")
    assert _config(model_path, {"method": "selfspec"}).speculative_config.model == DRAFTER_CLASS


def test_features_that_force_model_runner_v2():
    with pytest.raises(SelfSpecConfigError, match=r"Model Runner V2 \(forced by "
                       r"--watermark-config.*start without --watermark-config"):
        _guard("ngrammys", engine={"watermark_config": {}})
    with pytest.raises(SelfSpecConfigError, match="Model Runner V2 .*HiSparse"):
        _guard("ngrammys", engine={"attention_config": {"hisparse_config": {}}})


def test_async_scheduling_refused(model_path):
    _one_line_error(model_path, {"method": "selfspec"}, "does not support async scheduling "
                    r"\(--async-scheduling\).*start without --async-scheduling",
                    async_scheduling=True)


@pytest.mark.parametrize("spec, match", [
    ({"num_speculative_tokens": 0}, r"num_speculative_tokens must be an integer in \[1, 128\], "
                                    "got 0"),
    ({"num_speculative_tokens": "4"}, r"num_speculative_tokens must be an integer"),
    ({"draft_exit_threshold": "high"}, r"key 'draft_exit_threshold' of method 'selfspec' must "
                                       r"be a number in \[0.0, 1.0\], got 'high'"),
    ({"model": "some/draft"}, "key 'model' does not apply to method 'selfspec'"),
    ({"draft_sample_method": "nucleus"}, "draft_sample_method must be 'greedy' or"),
    ({"skip_mask": "/nonexistent/mask.json"}, "/nonexistent/mask.json does not exist"),
    ({"smoothing": 1.0}, r"key 'smoothing' of method 'selfspec' must be a number in \[0.0, "
                         r"1.0\)"),
])
def test_bad_values_through_the_config_path(model_path, spec, match):
    _one_line_error(model_path, {"method": "selfspec", **spec}, match)


def test_spec_tokens_twice(model_path):
    _one_line_error(model_path, {"method": "selfspec", "num_speculative_tokens": 4},
                    "--spec-tokens and num_speculative_tokens .* mutually exclusive",
                    spec_tokens=4)


def test_swift_mask_and_cache_hit(model_path):
    _one_line_error(model_path, {"method": "swift", "cache_hit": True,
                                 "skip_mask": {"attention": [1]}}, "not both")


def test_bigram_table_that_cannot_be_built(model_path, tmp_path, monkeypatch):
    """No table cached and transformers cannot load the model (remote code, a vLLM-only
    architecture): one line, not transformers' traceback."""
    from vllm_selfspec.builders import bigram as bigram_build

    def fail(*a, **k):
        raise ValueError("The repository contains custom code which must be executed.\nMore")

    monkeypatch.setenv("VLLM_SELFSPEC_CACHE", str(tmp_path))
    monkeypatch.setattr(bigram_build, "load_model", fail)
    msg = _one_line_error(model_path, {"method": "ngrammys"}, "no bigram table is cached for "
                          r"this model and building one failed \(ValueError: The repository")
    assert "bigram_table" in msg and "'ngram'" in msg


def test_unsupported_vllm_answers_our_methods(model_path, monkeypatch):
    """On a vLLM outside the supported range register() leaves vLLM alone but our method
    names get the version message (plugin.register)."""
    from vllm_selfspec import patches, plugin

    monkeypatch.setattr(plugin, "_registered_ok", False)
    monkeypatch.setattr(plugin, "_disabled_reason", "vllm_selfspec: " + patches.version_help("0.40.0"))
    msg = _one_line_error(model_path, {"method": "selfspec"}, "found vLLM 0.40.0")
    assert "pip install" in msg
