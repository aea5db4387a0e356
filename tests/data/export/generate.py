"""Writes tests/data/export/: exports of torch.onnx.export's defaults that fsdpc must refuse or accept as they are
(tests/py/bad_input.py compiles them; CI has no torch 2, so the files are committed).

usage: python3 tests/data/export/generate.py      (torch 2.15, onnx, onnxscript)

  dropped_bias.onnx  torch.onnx.export(model, args, f) with its defaults (dynamo, optimize=True) of a Conv2d whose
                     bias is zero (as torchvision's SqueezeNet initialises all 26 of its own), a Linear head and an
                     unused Linear: onnxscript's RemoveOptionalBiasFromConv drops the zero bias, so the graph lacks
                     'conv.bias' while the exported program's signature (graph metadata_props) lists it and the
                     Conv node's fx_node metadata names its placeholder: fsdpc refuses it, naming 'conv.bias' alone
                     ('unused.weight' and 'unused.bias' are missing too, but no operation reads them: PyTorch leaves
                     them as they are, so does fsdpc).
  tied_unused.onnx   the same dynamo export with optimize=False of an embedding tied to its output projection and an
                     unused Linear: the signature lists 'emb.weight' and 'head.weight', the graph holds one
                     initializer 'head.weight' read by both operations; fsdpc trains it and refuses nothing.
Inputs: x [1, 2, 6, 6] (dropped_bias), input_ids [1, 5] int64 (tied_unused); output y.  Weights from seed 0, inline.
"""
import os
import warnings

import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))


class DroppedBias(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3)
        nn.init.zeros_(self.conv.bias)
        self.head = nn.Linear(3, 4)
        self.unused = nn.Linear(2, 2)

    def forward(self, x):
        return self.head(torch.relu(self.conv(x)).mean((2, 3)))


class TiedUnused(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.emb.weight
        self.unused = nn.Linear(2, 2)

    def forward(self, input_ids):
        return self.head(torch.tanh(self.emb(input_ids)))


def main():
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(DroppedBias(), (torch.randn(1, 2, 6, 6),), os.path.join(HERE, "dropped_bias.onnx"),
                          input_names=["x"], output_names=["y"])
        torch.onnx.export(TiedUnused(), (torch.tensor([[1, 2, 3, 4, 5]]),), os.path.join(HERE, "tied_unused.onnx"),
                          dynamo=True, optimize=False, input_names=["input_ids"], output_names=["y"])
    for f in ("dropped_bias.onnx.data", "tied_unused.onnx.data"):  # the exporter's empty external data files
        p = os.path.join(HERE, f)
        if os.path.exists(p) and not os.path.getsize(p):
            os.remove(p)


if __name__ == "__main__":
    main()
