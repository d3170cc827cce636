#!/usr/bin/python3
"""Export the peers' models WITHOUT constant folding, for the fusion target "a model exported without constant folding
runs as fast as the folded export after the pipeline".

It builds exactly the module peers/make_models.py builds (same seed, weights, BN statistics, test input) and exports it
with torch.onnx.export(..., do_constant_folding=False, training=TrainingMode.PRESERVE): PyTorch's eval-mode peephole
(which folds BatchNormalization into the Conv before ONNX sees it) and its constant folding both stay off, so the file
keeps every BatchNormalization node, the Shape -> Gather -> Unsqueeze -> Concat -> Reshape chains of flatten/reshape,
and the constant subgraphs an unoptimised export has. The layout is make_models.py's (model.onnx, test_data_set_0/,
meta.json), so `keel bench`, `keel run` and peers/ort_bench.js read it as they read the folded export.

usage: /usr/bin/python3 tools/export_unfolded.py [--out /tmp/keel-peers/models-unfolded] [--peers /work/shared/peers]
                                                 [NAME ...]        (default: resnet18 transformer_enc)
"""
import argparse
import functools
import os
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/keel-peers/models-unfolded")
    ap.add_argument("--peers", default=os.environ.get("KEEL_PEERS_DIR", "/work/shared/peers"),
                    help="folder holding make_models.py")
    ap.add_argument("names", nargs="*", default=["resnet18", "transformer_enc"])
    a = ap.parse_args()
    sys.path.insert(0, a.peers)
    import torch
    import make_models  # noqa: E402  (the peers' model builder; its export() writes the files)

    unknown = [n for n in a.names if n not in make_models.MODELS]
    if unknown:
        ap.error(f"unknown model(s) {unknown}; known: {sorted(make_models.MODELS)}")
    original = torch.onnx.export

    @functools.wraps(original)
    def export_unfolded(*args, **kw):
        kw["do_constant_folding"] = False
        kw["training"] = torch.onnx.TrainingMode.PRESERVE  # the module is in eval mode: BN exported, not folded
        return original(*args, **kw)

    torch.onnx.export = export_unfolded
    flops = make_models.onnx_flops

    def onnx_flops_or_zero(path):
        # ONNX shape inference cannot see through a live Shape -> Reshape chain, which make_models' FLOP count needs.
        try:
            return flops(path)
        except (IndexError, KeyError):
            return 0

    make_models.onnx_flops = onnx_flops_or_zero
    torch.set_num_threads(2)
    for n in a.names:
        meta = make_models.export(n, a.out)
        print(f"[{n}] unfolded export: {meta['onnx_nodes']} nodes, ops {' '.join(meta['ops'])}")


if __name__ == "__main__":
    sys.exit(main())
