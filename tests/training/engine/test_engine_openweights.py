"""Models brought as open-weights directories: Llama and GPT-2 load, run and export exactly."""

from __future__ import annotations

import json

import boto3
import pytest
import torch
from safetensors.torch import load, save

from storage.objectstore import open_store
from tests.training.engine.tiny_open_weights import (
    random_weights,
    tiny_gpt2_hf,
    tiny_llama_hf,
    tiny_tokenizer_json,
    write_model_by_hand,
)
from training.engine.config_json import ModelConfigError
from training.engine.fragments import assign_fragments
from training.engine.gpt2 import GPT2Config
from training.engine.llama import LlamaConfig
from training.engine.model import family_config_from_hf, load_params, make_model
from training.engine.openweights import load_model, read_model_dir, write_model_dir

FAMILIES = {"llama": tiny_llama_hf, "gpt2": tiny_gpt2_hf}


def _store(tmp_path, name="model"):
    return open_store(f"file://{tmp_path / name}")


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_written_checkpoint_loads_and_gives_the_logits_of_the_model_that_wrote_it(tmp_path, family):
    hf = FAMILIES[family]()
    weights = random_weights(hf, seed=7)
    write_model_by_hand(_store(tmp_path), hf, weights)
    in_memory = load_params(make_model(family_config_from_hf(hf)), weights).eval()

    loaded = load_model(_store(tmp_path))
    idx = torch.randint(0, hf["vocab_size"], (3, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(loaded(idx), in_memory(idx))
    assert type(loaded).__name__ == {"llama": "Llama", "gpt2": "GPT2"}[family]


def test_parameter_names_are_the_checkpoint_tensor_names_of_each_family():
    llama = dict(make_model(family_config_from_hf(tiny_llama_hf(num_hidden_layers=1))).named_parameters())
    assert sorted(llama) == sorted(
        [
            "model.embed_tokens.weight",
            "model.layers.0.input_layernorm.weight",
            "model.layers.0.self_attn.q_proj.weight",
            "model.layers.0.self_attn.k_proj.weight",
            "model.layers.0.self_attn.v_proj.weight",
            "model.layers.0.self_attn.o_proj.weight",
            "model.layers.0.post_attention_layernorm.weight",
            "model.layers.0.mlp.gate_proj.weight",
            "model.layers.0.mlp.up_proj.weight",
            "model.layers.0.mlp.down_proj.weight",
            "model.norm.weight",
        ]
    )  # the head is tied: no lm_head.weight
    assert llama["model.layers.0.self_attn.k_proj.weight"].shape == (2 * 8, 32)  # 2 kv heads of 8
    untied = dict(
        make_model(family_config_from_hf(tiny_llama_hf(tie_word_embeddings=False))).named_parameters()
    )
    assert untied["lm_head.weight"].shape == (320, 32)
    gpt2 = dict(make_model(family_config_from_hf(tiny_gpt2_hf(n_layer=1))).named_parameters())
    assert sorted(gpt2) == sorted(
        ["wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"]
        + [
            f"h.0.{m}.{p}"
            for m in ("ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc", "mlp.c_proj")
            for p in ("weight", "bias")
        ]
    )
    assert gpt2["h.0.attn.c_attn.weight"].shape == (32, 96)  # GPT-2 keeps (in, out)


def test_export_then_import_is_exact_and_copies_the_tokenizer(tmp_path):
    hf = tiny_llama_hf(tie_word_embeddings=False, attention_bias=True)
    weights = random_weights(hf, seed=3)
    cfg = family_config_from_hf(hf)
    tokenizer = tiny_tokenizer_json()
    written = write_model_dir(_store(tmp_path, "out"), cfg=cfg, params=weights, tokenizer_json=tokenizer)
    assert written[-1] == "config.json"  # last: a directory with a config is complete

    again_cfg, again, from_checkpoint = read_model_dir(_store(tmp_path, "out"))
    assert from_checkpoint and again_cfg == cfg
    assert again.keys() == weights.keys()
    assert all(torch.equal(again[n], weights[n]) for n in weights)
    assert (tmp_path / "out" / "tokenizer.json").read_bytes() == tokenizer
    exported = json.loads((tmp_path / "out" / "config.json").read_text())
    assert exported["architectures"] == ["LlamaForCausalLM"] and exported["bos_token_id"] == 1
    # A second export of the import writes the same bytes.
    write_model_dir(_store(tmp_path, "out2"), cfg=again_cfg, params=again, tokenizer_json=tokenizer)
    for name in ("config.json", "model.safetensors"):
        assert (tmp_path / "out" / name).read_bytes() == (tmp_path / "out2" / name).read_bytes()


def test_a_model_directory_on_s3_exports_and_imports_exactly(s3_server):
    """On S3 the weights come back through a streamed temp copy that safetensors maps."""
    boto3.client("s3", endpoint_url=s3_server).create_bucket(Bucket="openweights-test")
    store = open_store("s3://openweights-test/models/tiny", endpoint_url=s3_server)
    hf = tiny_llama_hf(tie_word_embeddings=False)
    weights = random_weights(hf, seed=4)
    write_model_dir(store, cfg=family_config_from_hf(hf), params=weights)
    cfg, again, from_checkpoint = read_model_dir(store)
    assert from_checkpoint and cfg == family_config_from_hf(hf)
    assert again.keys() == weights.keys()
    assert all(torch.equal(again[n], weights[n]) for n in weights)


def test_export_writes_the_dtype_the_config_names(tmp_path):
    hf = tiny_gpt2_hf(torch_dtype="bfloat16")
    weights = random_weights(hf, seed=5)
    write_model_dir(_store(tmp_path), cfg=family_config_from_hf(hf), params=weights)
    tensors = load((tmp_path / "model" / "model.safetensors").read_bytes())
    assert {t.dtype for t in tensors.values()} == {torch.bfloat16}
    _, params, _ = read_model_dir(_store(tmp_path))
    assert torch.equal(params["wte.weight"], weights["wte.weight"].to(torch.bfloat16).float())


def test_hub_style_gpt2_files_with_a_prefix_mask_buffers_and_a_tied_head_load(tmp_path):
    hf = tiny_gpt2_hf()
    weights = random_weights(hf, seed=2)
    tensors = {f"transformer.{n}": t for n, t in weights.items()}
    tensors["transformer.h.0.attn.bias"] = torch.ones(1, 1, 64, 64)  # the causal-mask buffer
    tensors["lm_head.weight"] = weights["wte.weight"].clone()
    write_model_by_hand(_store(tmp_path), hf, tensors)
    _, params, _ = read_model_dir(_store(tmp_path))
    assert params.keys() == weights.keys()
    assert torch.equal(params["h.1.mlp.c_fc.weight"], weights["h.1.mlp.c_fc.weight"])


def test_a_sharded_checkpoint_loads_through_its_index(tmp_path):
    hf = tiny_llama_hf()
    weights = random_weights(hf, seed=4)
    store = _store(tmp_path)
    names = sorted(weights)
    half = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, part in half.items():
        store.put(file, save({n: weights[n].contiguous() for n in part}))
    weight_map = {n: file for file, part in half.items() for n in part}
    store.put("model.safetensors.index.json", json.dumps({"weight_map": weight_map}).encode())
    store.put("config.json", json.dumps(hf).encode())
    _, params, from_checkpoint = read_model_dir(store)
    assert from_checkpoint and all(torch.equal(params[n], weights[n]) for n in names)


def test_a_config_without_weights_starts_from_a_seeded_initialisation(tmp_path):
    write_model_by_hand(_store(tmp_path), tiny_llama_hf(), None)
    cfg, a, from_checkpoint = read_model_dir(_store(tmp_path), seed=11)
    _, b, _ = read_model_dir(_store(tmp_path), seed=11)
    _, c, _ = read_model_dir(_store(tmp_path), seed=12)
    assert not from_checkpoint and isinstance(cfg, LlamaConfig)
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert not torch.equal(
        a["model.norm.weight"] + a["model.embed_tokens.weight"].sum(),
        c["model.norm.weight"] + c["model.embed_tokens.weight"].sum(),
    )


def test_weights_that_do_not_match_the_config_are_refused_by_name(tmp_path):
    hf = tiny_llama_hf()
    weights = random_weights(hf, seed=1)
    wrong = dict(weights)
    wrong["model.layers.1.mlp.up_proj.weight"] = torch.zeros(3, 3)
    write_model_by_hand(_store(tmp_path, "shape"), hf, wrong)
    with pytest.raises(ModelConfigError, match=r"model.layers.1.mlp.up_proj.weight has shape \(3, 3\)"):
        read_model_dir(_store(tmp_path, "shape"))
    missing = {n: t for n, t in weights.items() if n != "model.norm.weight"}
    write_model_by_hand(_store(tmp_path, "missing"), hf, missing)
    with pytest.raises(ModelConfigError, match="1 missing .first: model.norm.weight"):
        read_model_dir(_store(tmp_path, "missing"))


@pytest.mark.parametrize(
    ("hf", "message"),
    [
        ({"model_type": "mamba"}, "model_type 'mamba' is not supported"),
        (tiny_llama_hf(num_key_value_heads=3), "num_key_value_heads must divide"),
        (tiny_llama_hf(hidden_act="gelu"), "hidden_act 'gelu' is not supported"),
        (tiny_llama_hf(hidden_size="32"), "hidden_size must be an integer"),
        (tiny_llama_hf(rope_scaling={"rope_type": "yarn", "factor": 4.0}), "not supported"),
        ({k: v for k, v in tiny_gpt2_hf().items() if k != "n_layer"}, "n_layer is required"),
        (tiny_gpt2_hf(activation_function="relu"), "activation_function 'relu'"),
    ],
)
def test_a_config_json_the_engine_cannot_build_says_why(hf, message):
    with pytest.raises(ModelConfigError, match=message):
        family_config_from_hf(hf)


def test_the_llama3_and_nested_rope_layouts_read_the_same():
    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32,
    }
    legacy = family_config_from_hf(tiny_llama_hf(rope_theta=500000.0, rope_scaling=scaling))
    nested = family_config_from_hf(
        {
            k: v
            for k, v in tiny_llama_hf(rope_parameters={**scaling, "rope_theta": 500000.0}).items()
            if k != "rope_theta"
        }
    )
    assert isinstance(legacy, LlamaConfig) and isinstance(nested, LlamaConfig)
    assert legacy.rope_theta == nested.rope_theta == 500000.0
    assert legacy.rope_scaling == nested.rope_scaling == scaling
    plain = make_model(family_config_from_hf(tiny_llama_hf(rope_theta=500000.0)))
    scaled = make_model(legacy)
    # Long wavelengths are slowed by the factor, the shortest are kept.
    assert torch.isclose(scaled.inv_freq[0], plain.inv_freq[0])
    assert torch.isclose(scaled.inv_freq[-1], plain.inv_freq[-1] / 8.0)


def test_fragments_split_each_family_by_its_layers():
    for hf, block in ((tiny_llama_hf(), "model.layers."), (tiny_gpt2_hf(), "h.")):
        params = dict(make_model(family_config_from_hf(hf)).named_parameters())
        frags = assign_fragments(params, fragments=2, assignment="strided")
        assert all(any(n.startswith(f"{block}{i}.") for n in frags[i]) for i in (0, 1))
        assert not any(n.startswith(f"{block}1.") for n in frags[0])
        assert sorted(n for f in frags for n in f) == sorted(params)
    assert isinstance(family_config_from_hf(tiny_gpt2_hf()), GPT2Config)
