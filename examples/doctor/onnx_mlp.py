"""A small ONNX model for the ONNX Runtime examples: an MLP 256 -> 4096 -> 4096 -> 10 built
with onnx's helper API (no export step, no file), with a dynamic batch axis."""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def mlp_bytes(seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    sizes = [256, 4096, 4096, 10]
    inits, nodes, prev = [], [], "x"
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        inits.append(numpy_helper.from_array((rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32), f"w{i}"))
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"h{i}"]))
        prev = f"h{i}"
        if i < len(sizes) - 2:
            nodes.append(helper.make_node("Relu", [prev], [f"r{i}"]))
            prev = f"r{i}"
    nodes.append(helper.make_node("Identity", [prev], ["y"]))
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 10])], inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()
