#!/usr/bin/python3
"""Further architectures for tools/compare_peers.py and tools/compare_passes.py: torchvision 0.14 ResNet-50 and
EfficientNet-B0, and transformer_gelu (the peers' 4-layer encoder, 256 wide, 4 heads, 128 tokens, with GELU in its
feed-forward layers as BERT has, exported at opset 14 as Hugging Face exports BERT: Gelu and LayerNormalization
arrive decomposed into Erf / ReduceMean chains); 1-D and 3-D convolution nets: tcn1d (a temporal conv net on audio
features [1,40,800]: Conv1d + BatchNorm1d + Relu, dilated residual blocks, MaxPool1d, a strided Conv1d,
AdaptiveAvgPool1d, Linear; 0.55 GFLOP), tcn1d_b8 (the same at batch 8) and c3d (a 3-D ResNet-style video net on
[1,3,8,64,64]: Conv3d 3x7x7 s(1,2,2), BatchNorm3d, MaxPool3d, residual Conv3d blocks, AvgPool3d, Linear; 0.6 GFLOP).

Common architectures a reviewer tries beyond those (torchvision 0.14, batch 1, 224x224 unless noted):
mobilenet_v3_large (HardSwish, squeeze-excite with HardSigmoid), shufflenet_v2_x1_0 (channel shuffle as
Reshape-Transpose-Reshape, Split), densenet121 (Concat after every layer), resnext50_32x4d (grouped 3x3 convs),
regnet_y_400mf (grouped convs + squeeze-excite), googlenet (inception Concat; aux_logits off), convnext_tiny (7x7
depthwise, LayerNorm over channels via Permute, GELU, layer scale), lraspp (LR-ASPP MobileNetV3-Large segmentation at
[1,3,320,320]: Resize bilinear upsampling, Sigmoid gating; the "out" map), fcn_resnet50 (FCN ResNet-50 segmentation,
dilated convs, bilinear Resize, at [1,3,128,128]: 17 GFLOP), deeplabv3_mobilenet_v3_large (DeepLabV3 on a
MobileNetV3-Large backbone with dilated last stages, ASPP with dilations 12/24/36 and a global-pool branch, bilinear
Resize; batch 2 at [2,3,160,160]; deeplabv3_mobilenet_v3_large_op13: the same exported at opset 13, hard-swish
as x * HardSigmoid(x)), mobilenet_v3_small and vit_b_16 (ViT-B/16: patch conv, 12 encoder layers;
35 GFLOP). ConvNeXt's layer scales (1e-6 in torchvision) are drawn around 0.1 and ViT's zeroed head is drawn, so that
the output depends on every block. No pretrained backbone is loaded (weights_backbone=None).

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
    # The same with GELU's tanh approximation (GPT-2's, Hugging Face's gelu_new / gelu_pytorch_tanh), which torch
    # writes out as Mul / Add / Tanh nodes: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (fuse_gelu's second form).
    "transformer_gelu_tanh": (8, "gelu_tanh_transformer", (1, 128, 256), 14),
    "tcn1d":            (41, "tcn1d", (1, 40, 800), 17),
    "tcn1d_b8":         (41, "tcn1d", (8, 40, 800), 17),
    "c3d":              (42, "c3d", (1, 3, 8, 64, 64), 17),
    "mobilenet_v3_large": (51, "mobilenet_v3_large", (1, 3, 224, 224), 17),
    "shufflenet_v2_x1_0": (52, "shufflenet_v2_x1_0", (1, 3, 224, 224), 17),
    "densenet121":      (53, "densenet121", (1, 3, 224, 224), 17),
    "resnext50_32x4d":  (54, "resnext50_32x4d", (1, 3, 224, 224), 17),
    "regnet_y_400mf":   (55, "regnet_y_400mf", (1, 3, 224, 224), 17),
    "googlenet":        (56, "googlenet", (1, 3, 224, 224), 17),
    "convnext_tiny":    (57, "convnext_tiny", (1, 3, 224, 224), 17),
    "lraspp":           (58, "lraspp", (1, 3, 320, 320), 17),
    "fcn_resnet50":     (59, "fcn_resnet50", (1, 3, 128, 128), 17),
    "vit_b_16":         (60, "vit_b_16", (1, 3, 224, 224), 17),
    "mobilenet_v3_small": (61, "mobilenet_v3_small", (1, 3, 224, 224), 17),
    "deeplabv3_mobilenet_v3_large": (62, "deeplabv3_mbv3", (2, 3, 160, 160), 17),
    # The same at opset 13, where torch has no HardSwish op and writes hard-swish as x * HardSigmoid(x).
    "deeplabv3_mobilenet_v3_large_op13": (62, "deeplabv3_mbv3", (2, 3, 160, 160), 13),
    # The peers' transformer_enc (same seed, weights and opset) with a dynamic batch dimension, so that `keel serve`
    # can batch its requests: the peers' export holds the batch of 1 in its Reshape constants.
    "transformer_enc_dynbatch": (5, "native_transformer", (1, 128, 256), 13),
}
# Exported again after make_models.export() (which writes the test data at the fixed shape) with the first dimension
# of the input and output named "batch".
DYNAMIC_BATCH = {"transformer_enc_dynbatch"}


def gelu_transformer():
    import torch.nn as nn
    layer = nn.TransformerEncoderLayer(256, 4, dim_feedforward=1024, dropout=0.0, activation="gelu",
                                       batch_first=True)
    return nn.TransformerEncoder(layer, 4, enable_nested_tensor=False)


def gelu_tanh_transformer():
    import torch.nn as nn
    import torch.nn.functional as F
    layer = nn.TransformerEncoderLayer(256, 4, dim_feedforward=1024, dropout=0.0,
                                       activation=lambda x: F.gelu(x, approximate="tanh"), batch_first=True)
    return nn.TransformerEncoder(layer, 4, enable_nested_tensor=False)


def tcn1d():
    import torch.nn as nn

    class Res1d(nn.Module):
        def __init__(self, c, d):
            super().__init__()
            self.c1 = nn.Conv1d(c, c, 3, padding=d, dilation=d, bias=False)
            self.b1 = nn.BatchNorm1d(c)
            self.c2 = nn.Conv1d(c, c, 3, padding=d, dilation=d, bias=False)
            self.b2 = nn.BatchNorm1d(c)

        def forward(self, x):
            return (self.b2(self.c2(self.b1(self.c1(x)).relu())) + x).relu()

    return nn.Sequential(nn.Conv1d(40, 128, 5, padding=2), nn.BatchNorm1d(128), nn.ReLU(),
                         Res1d(128, 1), Res1d(128, 2), nn.MaxPool1d(2), Res1d(128, 4), Res1d(128, 8),
                         nn.Conv1d(128, 256, 3, stride=2, padding=1), nn.BatchNorm1d(256), nn.ReLU(),
                         nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(256, 10))


def c3d():
    import torch.nn as nn

    class Res3d(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.c1 = nn.Conv3d(c, c, 3, padding=1, bias=False)
            self.b1 = nn.BatchNorm3d(c)
            self.c2 = nn.Conv3d(c, c, 3, padding=1, bias=False)
            self.b2 = nn.BatchNorm3d(c)

        def forward(self, x):
            return (self.b2(self.c2(self.b1(self.c1(x)).relu())) + x).relu()

    return nn.Sequential(nn.Conv3d(3, 32, (3, 7, 7), stride=(1, 2, 2), padding=(1, 3, 3), bias=False),
                         nn.BatchNorm3d(32), nn.ReLU(), nn.MaxPool3d((1, 3, 3), (1, 2, 2), (0, 1, 1)),
                         Res3d(32), nn.Conv3d(32, 64, 3, stride=2, padding=1, bias=False), nn.BatchNorm3d(64),
                         nn.ReLU(), Res3d(64), nn.AvgPool3d(2), nn.AdaptiveAvgPool3d(1), nn.Flatten(),
                         nn.Linear(64, 10))


def googlenet():
    import torchvision.models as tvm
    return tvm.googlenet(weights=None, aux_logits=False, init_weights=True)


class SegOut:
    """torchvision's segmentation nets return {"out": ...}; the exported graph keeps that map only."""

    @staticmethod
    def wrap(net):
        import torch.nn as nn

        class Out(nn.Module):
            def __init__(self):
                super().__init__()
                self.net = net

            def forward(self, x):
                return self.net(x)["out"]

        return Out()


def lraspp():
    import torchvision.models.segmentation as seg
    return SegOut.wrap(seg.lraspp_mobilenet_v3_large(weights=None, weights_backbone=None))


def deeplabv3_mbv3():
    import torchvision.models.segmentation as seg
    return SegOut.wrap(seg.deeplabv3_mobilenet_v3_large(weights=None, weights_backbone=None, aux_loss=False))


def fcn_resnet50():
    import torchvision.models.segmentation as seg
    return SegOut.wrap(seg.fcn_resnet50(weights=None, weights_backbone=None, aux_loss=False))


def convnext_tiny():
    """torchvision initialises the blocks' layer scale to 1e-6, which leaves the residual branches (the 7x7
    depthwise, LayerNorm, GELU) out of the output; random scales around 0.1 make them count in the check."""
    import torch
    import torchvision.models as tvm
    m = tvm.convnext_tiny(weights=None)
    with torch.no_grad():
        for b in m.modules():
            if hasattr(b, "layer_scale"):
                b.layer_scale.copy_(0.1 * (1 + 0.5 * torch.randn_like(b.layer_scale)))
    return m


def vit_b_16():
    """torchvision zeroes ViT's classification head, which would make the output the (perturbed) bias alone."""
    import torch
    import torchvision.models as tvm
    m = tvm.vit_b_16(weights=None)
    with torch.no_grad():
        m.heads.head.weight.normal_(0.0, 0.02)
    return m


LOCAL = {"gelu_transformer": gelu_transformer, "gelu_tanh_transformer": gelu_tanh_transformer, "tcn1d": tcn1d, "c3d": c3d, "googlenet": googlenet,
         "lraspp": lraspp, "fcn_resnet50": fcn_resnet50, "convnext_tiny": convnext_tiny, "vit_b_16": vit_b_16,
         "deeplabv3_mbv3": deeplabv3_mbv3}


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
        build = LOCAL[fn] if fn in LOCAL else mm.native_transformer if fn == "native_transformer" else (
            lambda fn=fn: mm._tv(fn))
        mm.MODELS[name] = (seed, build, shape)
        mm.export(name, a.out)
        if name in DYNAMIC_BATCH:
            export_dynamic_batch(mm, name, a.out, opset)


def export_dynamic_batch(mm, name, out_root, opset):
    """Replaces model.onnx with an export whose batch dimension is dynamic, and writes test_data_set_1: a batch of 3
    (the input, half of it, its negation) with PyTorch's output, to check the dynamic batch against, e.g.
    `keel run model.onnx -i input=test_data_set_1/input_0.pb -o OUT`."""
    import json
    import onnx
    import torch
    from onnx import numpy_helper

    m, x = mm.build_model(name)
    path = os.path.join(out_root, name, "model.onnx")
    torch.onnx.export(m, (x,), path, opset_version=opset, do_constant_folding=True, input_names=["input"],
                      output_names=["output"], dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}})
    model = onnx.load(path)
    onnx.checker.check_model(model)
    x3 = torch.cat([x, 0.5 * x, -x])
    with torch.no_grad():
        y3 = m(x3)
    td = os.path.join(out_root, name, "test_data_set_1")
    os.makedirs(td, exist_ok=True)
    for fname, t, tname in (("input_0.pb", x3, "input"), ("output_0.pb", y3, "output")):
        with open(os.path.join(td, fname), "wb") as f:
            f.write(numpy_helper.from_array(t.numpy(), tname).SerializeToString())
    meta_path = os.path.join(out_root, name, "meta.json")
    meta = json.load(open(meta_path))
    meta["onnx_nodes"] = len(model.graph.node)
    meta.setdefault("notes", []).append("batch dimension dynamic; test_data_set_1 at batch 3")
    json.dump(meta, open(meta_path, "w"), indent=1)
    print(f"[{name}] dynamic batch: {len(model.graph.node)} nodes")


if __name__ == "__main__":
    main()
