"""Embedding lookups on weight-only codes (issue 37): the runtime's ``take_wq`` (cpp/kernels/take_wq.cc)
dequantizes only the rows its indices name, bit-equal to numpy's dequantize-then-take, for every scheme the
codes have (int8 per row, int8 / 4-bit blocks with float32 or float16 scales, zero points, per-block
offsets as GGUF's Q4_1 / Q5_1 / K-quants, blocks of 16 as Q6_K); ids at the table's edges and of either
index dtype; an id out of range an InputError. ``bh.quantize(..., lookups=...)`` writes the Relax form the
oneDNN backend runs as one ``take_wq`` node, a table tied to an LM head being one constant of codes for the
lookup and the head's ``dense_wq``; ``bh.llm.from_gguf`` reads the embedding from its codes, with the
dequantized-table run's logits to the bit; ``from_hf(weights=..., embedding=...)`` puts the tables the option
says in the step (one set of codes for a tied table by default)."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest
import tvm
from tvm import relax

import byoc_hetero as bh
from reference import step_logits
from byoc_hetero.quant.weight_only import WeightCodes, dequantize_codes, quantize_matrix, quantize_weights

create = tvm.get_global_func("byoc_hetero.runtime.create")
ROWS, K = 37, 128


def _codes(bits: int, block: int | None, zp: bool, scale_dtype: str, offsets: bool, seed: int) -> WeightCodes:
    """Codes of a random [ROWS, K] table; with ``offsets``, unsigned codes from 0 with a float offset per
    block (llama.cpp's ``q * d + m``) in place of the symmetric codes' implicit zero point."""
    rng = np.random.default_rng(seed)
    codes = quantize_matrix(rng.standard_normal((ROWS, K)).astype(np.float32), bits, block, zp, scale_dtype)
    if offsets:
        codes.offsets = rng.standard_normal(codes.scales.shape).astype(np.float32)
        if bits == 8:
            codes.codes = rng.integers(0, 32, codes.codes.shape).astype(np.uint8)  # Q5_1's codes 0..31
    codes.check()
    return codes


SCHEMES = [  # (bits, block or None: one scale per row, zero points, scale dtype, offsets)
    (8, None, False, "float32", False), (8, 32, False, "float16", False), (8, 32, True, "float32", False),
    (8, 16, False, "float32", False),  # GGUF's Q6_K as read: int8 codes q - 32, blocks of 16
    (8, 32, False, "float32", True),  # Q5_1 / Q5_K: codes 0..31 and offsets
    (4, 32, False, "float16", False), (4, 64, True, "float32", False), (4, None, True, "float16", False),
    (4, 32, False, "float32", True),  # Q4_1 / Q4_K: nibbles and offsets
]


def _region(ids_shape, codes: WeightCodes, ids_dtype: str) -> tuple[str, list]:
    """A one-node take_wq document and its constants (codes, scales[, zero points][, offsets])."""
    consts = [codes.codes, codes.scales] + [a for a in (codes.zero_points, codes.offsets) if a is not None]
    tensors = [{"shape": list(ids_shape), "dtype": ids_dtype}]
    tensors += [{"shape": list(c.shape), "dtype": str(c.dtype)} for c in consts]
    tensors.append({"shape": list(ids_shape) + [codes.shape[1]], "dtype": "float32"})
    attrs = {"bits": codes.bits, "block": codes.block, "has_zero_point": int(codes.zero_points is not None),
             "has_offset": int(codes.offsets is not None)}
    doc = {"format": "byoc_hetero.region", "version": 1, "symbol": "tq", "tensors": tensors, "inputs": [0],
           "outputs": [len(tensors) - 1],
           "constants": [{"tensor": i + 1, "name": f"tq_c{i}"} for i in range(len(consts))],
           "nodes": [{"op": "take_wq", "inputs": list(range(len(tensors) - 1)), "output": len(tensors) - 1,
                      "attrs": attrs}]}
    return json.dumps(doc), consts


def _run(ids: np.ndarray, codes: WeightCodes) -> np.ndarray:
    text, consts = _region(ids.shape, codes, str(ids.dtype))
    mod = create(text)
    assert mod["__init_tq"]([tvm.runtime.tensor(np.ascontiguousarray(c)) for c in consts]) == 0
    out = tvm.runtime.tensor(np.full(ids.shape + (codes.shape[1],), np.nan, np.float32))
    mod["tq"](tvm.runtime.tensor(ids), out)
    return out.numpy()


@pytest.mark.parametrize("bits,block,zp,scale_dtype,offsets", SCHEMES)
def test_kernel_equals_numpy_dequantize_then_take(bits, block, zp, scale_dtype, offsets):
    codes = _codes(bits, block, zp, scale_dtype, offsets, seed=bits * 100 + (block or 0) + zp + 7 * offsets)
    table = dequantize_codes(codes)
    ids = np.array([[0, ROWS - 1, 5], [ROWS - 1, 0, 17]], np.int64)  # the edges, a repeat, a decode-size run
    np.testing.assert_array_equal(_run(ids, codes), table[ids])
    one = np.array([ROWS - 1], np.int32)
    np.testing.assert_array_equal(_run(one, codes), table[one])


@pytest.mark.parametrize("bad", [-1, ROWS, 2 ** 40])
def test_out_of_range_id_is_an_input_error(bad):
    codes = _codes(4, 32, False, "float16", False, seed=3)
    with pytest.raises(bh.InputError, match=rf"index {bad} at position 1 of the indices is out of range for a "
                                            rf"table of {ROWS} rows"):
        _run(np.array([2, bad, 3], np.int64), codes)


def test_region_rejects_bad_attrs_and_a_zero_scale():
    codes = _codes(8, 32, False, "float32", False, seed=4)
    text, consts = _region((3,), codes, "int64")
    doc = json.loads(text)
    doc["nodes"][0]["attrs"]["block"] = 48
    with pytest.raises(ValueError, match="block 48 must be K = 128 or a power of two >= 16 dividing K"):
        create(json.dumps(doc))
    doc = json.loads(text)
    doc["tensors"][0]["dtype"] = "float32"
    with pytest.raises(ValueError, match="indices must be int64 or int32, got float32"):
        create(json.dumps(doc))
    codes.scales[ROWS - 1, 2] = 0.0
    with pytest.raises(ValueError, match=rf"scales\[{ROWS - 1}, 2\] is 0: expected a finite, nonzero scale"):
        _run(np.array([1, ROWS - 1], np.int64), codes)


def _tied_module(vocab: int, hidden: int) -> tvm.IRModule:
    """take(w, ids) -> matmul(h, permute_dims(w)): an embedding and the LM head tied to it."""
    ids = relax.Var("ids", relax.TensorType((1, tvm.tirx.Var("S", "int64")), "int64"))
    w = relax.Var("w", relax.TensorType((vocab, hidden), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [ids, w], attrs={"num_input": 1}):
        with bb.dataflow():
            h = bb.emit(relax.op.take(w, ids, axis=0))
            out = bb.emit_output(bb.emit(relax.op.matmul(h, bb.emit(relax.op.permute_dims(w, [1, 0])))))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("weights,group", [("int8", None), ("int4", 32)])
def test_tied_table_is_one_constant_of_codes_for_the_lookup_and_the_head(monkeypatch, weights, group):
    """``bh.quantize(lookups=...)``: the take and the tied matmul read one ``w.codes`` (no float ``w``); the
    region is a ``take_wq`` and a ``dense_wq`` node whose constants hold the codes once and nothing the size of
    a float table; the outputs equal numpy's on the dequantized table (float activations: exact path)."""
    from byoc_hetero._relax import region_table

    monkeypatch.setenv("BYOC_HETERO_WQ_ACT", "f32")
    vocab, hidden = 97, 64
    table = np.random.default_rng(0).standard_normal((vocab, hidden)).astype(np.float32)
    q = quantize_weights(_tied_module(vocab, hidden), {"w": table}, weights=weights, group_size=group,
                         lookups=("w",), verbose=False)
    assert [p.name for p in q.mod["main"].params] == ["ids", "w.codes", "w.scales"] and q.lookups == ["w"]
    part = bh.partition(q.mod, q.params)
    (region,) = region_table(part).values()
    graph = region.graph
    assert [n["op"] for n in graph["nodes"]] == ["take_wq", "dense_wq"], graph["nodes"]
    take, dense = graph["nodes"]
    assert take["inputs"][1] == dense["inputs"][1]  # one tensor of codes
    sizes = [int(np.prod(graph["tensors"][c["tensor"]]["shape"])) for c in graph["constants"]]
    assert len(graph["constants"]) == 2 and max(sizes) == vocab * hidden * int(weights[3:]) // 8, graph["constants"]
    from byoc_hetero.timing import build

    vm = relax.VirtualMachine(build(part), tvm.cpu())
    codes = WeightCodes(int(weights[3:]), q.group_size or hidden, q.params["w.codes"], q.params["w.scales"])
    dequantized = dequantize_codes(codes)
    ids = np.array([[vocab - 1, 0, 3]], np.int64)
    want = dequantized[ids].astype(np.float64) @ dequantized.T.astype(np.float64)
    got = vm["main"](tvm.runtime.tensor(ids)).numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * np.abs(want).max())
    with pytest.raises(bh.InputError, match=f"index {vocab} at position 1"):
        vm["main"](tvm.runtime.tensor(np.array([[1, vocab]], np.int64)))


gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
import gguf_write  # noqa: E402

LENGTH = 24
CONFIG = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.1)
PROMPT = np.array([[5, 17, 3, 299, 0, 7]])  # the table's first and last rows among them


_FOLDERS: dict[bool, str] = {}


def _hf_folder(tmp_path_factory, tied: bool) -> str:
    """A saved random one-layer Llama, its LM head tied to the embedding or not (once per module run)."""
    if tied not in _FOLDERS:
        torch.manual_seed(2)
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG, tie_word_embeddings=tied)).eval()
        folder = tmp_path_factory.mktemp(f"tied{tied}")
        model.save_pretrained(folder)
        _FOLDERS[tied] = str(folder)
    return _FOLDERS[tied]


def _region_graphs(part) -> list[dict]:
    from byoc_hetero._relax import region_table

    return [r.graph for r in region_table(part).values()]


@pytest.mark.parametrize("fmt,tied", [("q4_1", True)])  # untied files: tests/test_gguf.py's [output] cases
def test_gguf_embedding_reads_the_codes_with_the_dequantized_tables_logits(tmp_path_factory, tmp_path, restore_rules,
                                                                         fmt, tied):
    """``from_gguf``: ``token_embd.weight`` (tied to the head or not) is read by a ``take_wq`` node on its codes,
    no float32 [vocab, hidden] constant in the step; its logits (prefill and decode steps) and greedy tokens
    equal, to the bit, the run whose lookup reads the dequantized table (the take_wq rules removed: the same
    rows, dequantized whole)."""
    path = gguf_write.write_gguf(_hf_folder(tmp_path_factory, tied), str(tmp_path / f"m.{fmt}.gguf"), fmt)
    vocab, hidden = CONFIG["vocab_size"], CONFIG["hidden_size"]
    part, spec, _ = bh.llm.gguf.partitioned_gguf(path, max_length=LENGTH)
    assert spec.tied_embeddings is tied
    graphs = _region_graphs(part)
    takes = [(g, n) for g in graphs for n in g["nodes"] if n["op"] in ("take", "take_wq")]
    assert [n["op"] for _, n in takes][:1] == ["take_wq"], takes
    graph, take = takes[0]
    codes = graph["tensors"][take["inputs"][1]]
    assert codes["shape"][0] == vocab and codes["dtype"] in ("int8", "uint8"), codes
    floats = [g["tensors"][c["tensor"]] for g in graphs for c in g["constants"]
              if g["tensors"][c["tensor"]]["shape"] == [vocab, hidden]]
    assert not any(t["dtype"] == "float32" for t in floats), floats
    if spec.tied_embeddings:  # the head's dense_wq reads the same constant
        assert any(n["op"] == "dense_wq" and n["inputs"][1] == take["inputs"][1] for n in graph["nodes"])
    gen = bh.llm.from_gguf(path, max_length=LENGTH)
    tokens = gen.generate(PROMPT, max_new_tokens=8)
    got = step_logits(gen, tokens[:, :-1], PROMPT.shape[1])
    for rule in ("take_wq8", "take_wq4"):
        bh.unregister_pattern("onednn", rule)
    table_part = bh.llm.gguf.partitioned_gguf(path, max_length=LENGTH)[0]
    assert not any(n["op"] == "take_wq" for g in _region_graphs(table_part) for n in g["nodes"])
    reference = bh.llm.from_gguf(path, max_length=LENGTH)
    np.testing.assert_array_equal(got, step_logits(reference, tokens[:, :-1], PROMPT.shape[1]))
    np.testing.assert_array_equal(reference.generate(PROMPT, max_new_tokens=8), tokens)


@pytest.mark.parametrize("weights,lm_head,embedding,want", [
    ("int8", None, None, [("int8", 64)]),  # the head's codes serve the lookup: one set
    ("int4", "int8", None, [("int8", 64)]),  # the head int8 (its own pass), the lookup as the head
    ("int4", None, "int8", [("int8", 64), ("uint8", 32)]),  # two formats: two sets
    ("int8", None, "f32", [("float32", 64), ("int8", 64)]),  # NNCF's uncompressed embeddings
])
def test_from_hf_embedding_option(tmp_path_factory, weights, lm_head, embedding, want):
    """``from_hf(weights=..., lm_head=..., embedding=...)`` on a tied model: the lookup a ``take_wq`` on codes
    (None: the LM head's own, so the tied table is one constant) or, with ``embedding="f32"``, a ``take`` of
    the float table; the region's tables (constants of [vocab, >= hidden / 2]) are exactly ``want``
    ((dtype, columns): int8 codes 64 a row, 4-bit ones 32, float32 64)."""
    from byoc_hetero._relax import region_table

    model = transformers.LlamaForCausalLM.from_pretrained(_hf_folder(tmp_path_factory, True)).eval()
    part, _, error = bh.llm.partitioned_step(model, max_length=LENGTH, weights=weights, lm_head=lm_head,
                                             embedding=embedding)
    assert error is not None and error > 0
    (region,) = region_table(part).values()
    graph = region.graph
    shapes = [graph["tensors"][c["tensor"]] for c in graph["constants"]]
    tables = sorted((t["dtype"], t["shape"][1]) for t in shapes if len(t["shape"]) == 2
                    and t["shape"][0] == CONFIG["vocab_size"] and t["shape"][1] >= CONFIG["hidden_size"] // 2)
    assert tables == want, tables
    lookup = [n["op"] for n in graph["nodes"] if n["op"] in ("take", "take_wq")
              and graph["tensors"][n["inputs"][0 if n["op"] == "take" else 1]]["shape"][0] == CONFIG["vocab_size"]]
    assert lookup == ["take" if embedding == "f32" else "take_wq"], lookup


def test_from_hf_embedding_option_bad_values():
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG, tie_word_embeddings=True)).eval()
    with pytest.raises(bh.InputError, match="embedding='int8' applies to weights='int8' / 'int4', not 'f32'"):
        bh.llm.partitioned_step(model, max_length=LENGTH, embedding="int8")
    with pytest.raises(bh.InputError, match=r"embedding must be None \(as the LM head\), int8, int4, f32; "
                                            r"got 'int2'"):
        bh.llm.partitioned_step(model, max_length=LENGTH, weights="int8", embedding="int2")
