"""DeBERTa-v2/v3 (random weights): regions and ops left on llvm through ``bh.from_torch`` and
``bh.from_onnx`` of torch's default (dynamo) exporter's file, and the output's error against torch
(issue 39 item 4; results in bench/ZOO.md). No timings: a partition check.

    python bench/deberta_regions.py [--seq 128] [--layers 12] [--hidden 768] [--heads 12]
                                    [--buckets 256] [--vocab 128100] [--paths from_torch,from_onnx]

The defaults are DeBERTa-v3-base's sizes; ``--layers 2 --hidden 64 --heads 2`` is a quick shape.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from zoo_models import SEED  # noqa: E402 - importing it stubs torchvision's C++ operators (transformers imports it)


def _model(args):
    import torch
    import transformers

    config = transformers.DebertaV2Config(
        vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=args.layers, num_attention_heads=args.heads,
        intermediate_size=4 * args.hidden, max_position_embeddings=512, relative_attention=True,
        position_buckets=args.buckets, pos_att_type=["p2c", "c2p"], max_relative_positions=-1, type_vocab_size=0,
        norm_rel_ebd="layer_norm", share_att_key=True)
    torch.manual_seed(SEED)
    inner = transformers.DebertaV2Model(config).eval()

    class FirstOutput(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = inner

        def forward(self, ids):
            return self.model(ids, return_dict=False)[0]

    return FirstOutput().eval()


def main() -> None:
    import torch
    import tvm
    from tvm import relax

    import byoc_hetero as bh

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in (("seq", 128), ("layers", 12), ("hidden", 768), ("heads", 12), ("buckets", 256),
                          ("vocab", 128100)):
        ap.add_argument(f"--{name}", type=int, default=default)
    ap.add_argument("--paths", default="from_torch,from_onnx")
    args = ap.parse_args()
    model = _model(args)
    ids = torch.randint(0, args.vocab, (1, args.seq), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(ids).numpy()
    print(f"DeBERTa-v2 layers={args.layers} hidden={args.hidden} heads={args.heads} buckets={args.buckets} "
          f"ids 1x{args.seq}")
    print("| path | regions | ops on llvm | which (count) | rel. error vs torch |")
    print("|---|---|---|---|---|")
    for path in args.paths.split(","):
        if path == "from_torch":
            mod, params = bh.from_torch(model, (ids,))
        else:
            onnx_path = os.path.join(tempfile.mkdtemp(), "deberta.onnx")
            torch.onnx.export(model, (ids,), onnx_path, input_names=["ids"], output_names=["y"])
            mod, params = bh.from_onnx(onnx_path)
        part = bh.partition(mod, params)
        rep = bh.report(part)
        which = collections.Counter(str(f.op) for f in rep.fallbacks)
        vm = relax.VirtualMachine(relax.build(part, target="llvm"), tvm.cpu())
        out = vm["main"](tvm.runtime.tensor(ids.numpy()))
        got = (out if hasattr(out, "numpy") else out[0]).numpy()
        err = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
        listed = ", ".join(f"{op} x{n}" for op, n in which.most_common())
        print(f"| {path} | {len(rep.regions)} | {len(rep.fallbacks)} | {listed or '-'} | {err:.1e} |", flush=True)


if __name__ == "__main__":
    main()
