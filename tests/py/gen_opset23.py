"""Writes tests/data/opset23/: small opset-23+ models of RMSNormalization, RotaryEmbedding and Attention (and the inputs and outputs that
onnx's ReferenceEvaluator computes for them), which functions.py checks fsdpc against with Debian's onnx 1.12,
which has no opset 23.  Run with an onnx >= 1.18 (pyenv's 1.23): python3 tests/py/gen_opset23.py"""
import os

import numpy as np
import onnx
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "opset23")
rng = np.random.default_rng(23)


def case(name, node, inputs, opset=23):
    """node over graph inputs `inputs`; every output of the node is stored as out.NAME"""
    dt = {np.dtype(np.float64): TensorProto.DOUBLE, np.dtype(np.float32): TensorProto.FLOAT,
          np.dtype(np.bool_): TensorProto.BOOL, np.dtype(np.int64): TensorProto.INT64}
    vi = lambda n, a: helper.make_tensor_value_info(n, dt[a.dtype], list(a.shape))
    outs = [o for o in node.output if o]
    graph = lambda ys: helper.make_graph([node], name, [vi(k, v) for k, v in inputs.items()],
                                         [vi(o, y) if y is not None else helper.make_value_info(o, onnx.TypeProto())
                                          for o, y in zip(outs, ys)])
    model = lambda ys: helper.make_model(graph(ys), opset_imports=[helper.make_opsetid("", opset)])
    ys = ReferenceEvaluator(model([None] * len(outs))).run(None, inputs)
    m = model(ys)  # the outputs typed by what the reference computed
    onnx.checker.check_model(m)
    onnx.save(m, os.path.join(OUT, name + ".onnx"))
    np.savez(os.path.join(OUT, name + ".npz"), **{"out." + o: y for o, y in zip(outs, ys)}, **inputs)
    print(name, [y.shape for y in ys])


def main():
    os.makedirs(OUT, exist_ok=True)
    case("rms_last", helper.make_node("RMSNormalization", ["X", "scale"], ["Y"], epsilon=1e-3),
         {"X": rng.standard_normal((2, 3, 8)), "scale": rng.standard_normal(8)})
    case("rms_axis1", helper.make_node("RMSNormalization", ["X", "scale"], ["Y"], axis=1, stash_type=1),
         {"X": rng.standard_normal((2, 3, 4)), "scale": rng.standard_normal((3, 4))})
    mask = rng.random((3, 4)) < 0.7
    mask[1] = False  # a row with no key: zeros
    case("attention_gqa_causal_past",
         helper.make_node("Attention", ["Q", "K", "V", "mask", "past_key", "past_value"],
                          ["Y", "present_key", "present_value", "qk"], is_causal=1, qk_matmul_output_mode=3),
         {"Q": rng.standard_normal((2, 4, 3, 8)), "K": rng.standard_normal((2, 2, 3, 8)),
          "V": rng.standard_normal((2, 2, 3, 5)), "mask": mask, "past_key": rng.standard_normal((2, 2, 2, 8)),
          "past_value": rng.standard_normal((2, 2, 2, 5))})
    case("attention_3d_softcap_float32",
         helper.make_node("Attention", ["Q", "K", "V", "mask"], ["Y", "", "", "qk"], q_num_heads=4, kv_num_heads=2,
                          softcap=3.0, scale=0.25, softmax_precision=11, qk_matmul_output_mode=2),
         {"Q": rng.standard_normal((2, 3, 16)).astype(np.float32), "K": rng.standard_normal((2, 5, 8)).astype(np.float32),
          "V": rng.standard_normal((2, 5, 12)).astype(np.float32),
          "mask": rng.standard_normal((2, 1, 3, 5)).astype(np.float32)})
    ang = rng.standard_normal((6, 4))  # 6 positions, head size 8
    case("rope_4d_position_ids", helper.make_node("RotaryEmbedding", ["X", "cos", "sin", "pos"], ["Y"]),
         {"X": rng.standard_normal((2, 3, 4, 8)), "cos": np.cos(ang), "sin": np.sin(ang),
          "pos": np.array([[0, 1, 2, 3], [5, 4, 0, 2]], np.int64)})
    ang = rng.standard_normal((2, 3, 3))  # rotary_embedding_dim 6 of head size 10
    case("rope_3d_interleaved_partial",
         helper.make_node("RotaryEmbedding", ["X", "cos", "sin"], ["Y"], interleaved=1, rotary_embedding_dim=6,
                          num_heads=2),
         {"X": rng.standard_normal((2, 3, 20)), "cos": np.cos(ang), "sin": np.sin(ang)})
    case("attention_window", helper.make_node("Attention", ["Q", "K", "V"], ["Y"], left_window_size=1,
                                              right_window_size=2),
         {"Q": rng.standard_normal((1, 2, 4, 4)), "K": rng.standard_normal((1, 2, 6, 4)),
          "V": rng.standard_normal((1, 2, 6, 3))}, opset=25)


if __name__ == "__main__":
    main()
