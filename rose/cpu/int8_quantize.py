"""The int8 copy of the CPU fast path's float32 export, for ``int8.py``:
ONNX Runtime's dynamic quantization (weights int8 once, activations
quantized per call; its matmuls multiply int8 on VNNI or ARM's dot-product
instructions). Runs in a child process (``python -m
rose.cpu.int8_quantize``), as the export does: seconds of Python holding
the GIL and a second copy of the weights in memory stay out of the server,
and the child ends when its server does (``onnx_export.die_with_parent``).

The recipe, measured on all-MiniLM-L6-v2 (docs/latency.md): MatMul only,
weights per output channel. The export's linear layers are ``Gemm`` nodes,
which ONNX Runtime's dynamic quantizer leaves in float32, so each one with
constant weights becomes a MatMul and an Add first. Embedding tables
(``Gather``) stay float32: quantized they cost cosine for no step time.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

# The ops quantized (ONNX Runtime's names); part of the copy's cache key.
OPS = ("MatMul",)


def gemm_as_matmul(model) -> int:
    """Rewrites each ``Gemm`` with a constant weight (alpha = beta = 1, A
    not transposed) as MatMul + Add on the same values, in place; how many."""
    from onnx import helper, numpy_helper

    graph = model.graph
    weights = {t.name: t for t in graph.initializer}
    nodes, done = [], 0
    for node in graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        plain = attrs.get("alpha", 1.0) == 1.0 and attrs.get("beta", 1.0) == 1.0 and not attrs.get("transA", 0)
        if node.op_type != "Gemm" or node.input[1] not in weights or not plain:
            nodes.append(node)
            continue
        w = weights[node.input[1]]
        if attrs.get("transB", 0):  # stored [out, in]: MatMul wants [in, out]
            t = numpy_helper.from_array(numpy_helper.to_array(w).T.copy(), f"{w.name}__t")
            graph.initializer.append(t)
            weights[t.name] = t
            w = t
        bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
        product = f"{node.output[0]}__matmul" if bias else node.output[0]
        nodes.append(helper.make_node("MatMul", [node.input[0], w.name], [product], name=f"{node.name}__matmul"))
        if bias:
            nodes.append(helper.make_node("Add", [product, bias], [node.output[0]], name=f"{node.name}__bias"))
        done += 1
    del graph.node[:]
    graph.node.extend(nodes)
    used = {i for n in graph.node for i in n.input}
    kept = [t for t in graph.initializer if t.name in used]  # a transposed weight's original
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return done


def quantize(src: str, out: str, per_channel: bool, reduce_range: bool) -> None:
    """Writes the int8 copy of the export ``src`` to ``out`` (weights in a
    file beside it: a large model's pass 2 GiB)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    model = onnx.load(src)
    gemm_as_matmul(model)
    weights = {t.name for t in model.graph.initializer}
    if not any(n.op_type == "MatMul" and n.input[1] in weights for n in model.graph.node):
        raise RuntimeError("the export has no matmul with constant weights to quantize")
    # Saved and quantized from a path: ONNX Runtime's shape inference then
    # works on files, and a model past protobuf's 2 GiB stays loadable.
    plain = Path(out).parent / "tmp" / "matmul.onnx"
    plain.parent.mkdir(exist_ok=True)
    onnx.save(model, str(plain), save_as_external_data=True, location="matmul.onnx.data")
    del model
    quantize_dynamic(str(plain), out, op_types_to_quantize=list(OPS), per_channel=per_channel,
                     reduce_range=reduce_range, weight_type=QuantType.QInt8, use_external_data_format=True,
                     extra_options={"MatMulConstBOnly": True})


def main(argv: list[str] | None = None) -> int:
    import argparse

    from .onnx_export import die_with_parent

    p = argparse.ArgumentParser(prog="python -m rose.cpu.int8_quantize",
                                description="Quantize a CPU fast path export to int8 (dynamic).")
    p.add_argument("src")
    p.add_argument("out")
    p.add_argument("--per-channel", action="store_true")
    p.add_argument("--reduce-range", action="store_true", help="7-bit weights (CPUs without int8 dot products)")
    p.add_argument("--parent", type=int, default=0,
                   help="end (removing OUT's folder) when this process is gone; 0 = not watched")
    args = p.parse_args(argv)
    if args.parent:
        die_with_parent(args.parent, Path(args.out).parent)
    os.nice(10)  # behind the server's own steps
    logging.getLogger().setLevel(logging.ERROR)  # the quantizer's advice to pre-process, per call
    quantize(args.src, args.out, args.per_channel, args.reduce_range)
    return 0


if __name__ == "__main__":
    sys.exit(main())
