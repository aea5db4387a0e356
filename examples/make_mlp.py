"""Regenerate examples/mlp.onnx (the demo model) with PyTorch.

    /usr/bin/python3 examples/make_mlp.py

A 3-layer MLP, 16 -> 64 -> 64 -> 1, exported in training mode so parameter
names and layouts are kept; the batch axis is symbolic ("batch").
"""
import inspect
import os

import torch


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 64)
        self.fc2 = torch.nn.Linear(64, 64)
        self.head = torch.nn.Linear(64, 1)

    def forward(self, x):
        return self.head(torch.relu(self.fc2(torch.tanh(self.fc1(x)))))


torch.manual_seed(0)
path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mlp.onnx")
# the TorchScript exporter on every torch (dynamo=True is torch 2.9's default; it takes none of these options)
kw = {"dynamo": False} if "dynamo" in inspect.signature(torch.onnx.export).parameters else {}
torch.onnx.export(MLP(), (torch.zeros(8, 16),), path, input_names=["x"], output_names=["y"],
                  dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}}, opset_version=17,
                  training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False, **kw)
print("wrote", path)
