#!/usr/bin/python3
"""Further architectures for tools/compare_peers.py and tools/compare_passes.py: torchvision 0.14 ResNet-50 and
EfficientNet-B0, and transformer_gelu (the peers' 4-layer encoder, 256 wide, 4 heads, 128 tokens, with GELU in its
feed-forward layers as BERT has, exported at opset 14 as Hugging Face exports BERT: Gelu and LayerNormalization
arrive decomposed into Erf / ReduceMean chains).

Built and exported exactly as ../shared/peers/make_models.py builds its models (random weights seeded per model,
biases perturbed, BatchNorm running statistics calibrated on random batches, eval mode; its `export` writes
model.onnx, test_data_set_0 with the input and PyTorch's output, meta.json and torch_state.pt), except for the
ONNX opset (17 for the CNNs). Nothing is downloaded.

Run with the Debian python (torch 1.13 / torchvision 0.14 / onnx 1.12):
    /usr/bin/python3 tools/make_extra_models.py [--out /tmp/keel-peers/models] [NAME ...]
then e.g.
    tools/compare_peers.py --models resnet50,efficientnet_b0 --threads 1,2 --peers ort --verify
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PEERS = os.path.join(os.path.dirname(os.path.dirname(HERE)), "shared", "peers")

# name -> (seed, builder: a torchvision model name or a function, input shape, ONNX opset).
EXTRA = {
    "resnet50":         (6, "resnet50", (1, 3, 224, 224), 17),
    "efficientnet_b0":  (7, "efficientnet_b0", (1, 3, 224, 224), 17),
    "transformer_gelu": (8, "gelu_transformer", (1, 128, 256), 14),
}


def gelu_transformer():
    import torch.nn as nn
    layer = nn.TransformerEncoderLayer(256, 4, dim_feedforward=1024, dropout=0.0, activation="gelu",
                                       batch_first=True)
    return nn.TransformerEncoder(layer, 4, enable_nested_tensor=False)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="/tmp/keel-peers/models")
    ap.add_argument("--peers-dir", default=os.environ.get("KEEL_PEERS_DIR", PEERS),
                    help="where make_models.py is (default: ../shared/peers)")
    ap.add_argument("names", nargs="*", help=f"models to export (default: all of {', '.join(EXTRA)})")
    a = ap.parse_args()
    if not os.path.isfile(os.path.join(a.peers_dir, "make_models.py")):
        sys.exit(f"make_extra_models: no make_models.py in {a.peers_dir} (give --peers-dir)")
    names = a.names or list(EXTRA)
    unknown = [n for n in names if n not in EXTRA]
    if unknown:
        sys.exit(f"make_extra_models: unknown model(s) {', '.join(unknown)}; known: {', '.join(EXTRA)}")

    sys.path.insert(0, a.peers_dir)
    import make_models as mm  # noqa: E402  (its helpers: seeding, BN calibration, export, test data)
    import torch  # noqa: E402

    torch.set_num_threads(2)
    for name in names:
        seed, fn, shape, opset = EXTRA[name]
        mm.OPSET = opset  # export() and meta.json read the module's OPSET
        build = gelu_transformer if fn == "gelu_transformer" else (lambda fn=fn: mm._tv(fn))
        mm.MODELS[name] = (seed, build, shape)
        mm.export(name, a.out)


if __name__ == "__main__":
    main()
