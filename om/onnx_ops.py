"""The ONNX operators ATC parses, per opset, and the limits it puts on their attributes, as data with a
source per entry. sam3track's fake atc refuses a graph outside them with ATC's error codes, and
om.prepass refuses it before atc runs. Sources, method and what they leave open: docs/ascend.md,
"What the fake atc checks".
"""

from __future__ import annotations

from dataclasses import dataclass

from graphs.onnx_rewrites import canonical_equation

SOURCES = {
    "ops-nn": "hicann/ops-nn @e5c3fa9327ea95ba26d06227e746923580d10921 (CANN's NN operators and their ONNX "
              "parser plugins, framework/*_onnx_plugin.cpp: REGISTER_CUSTOM_OP ... OriginOpType(\"ai.onnx::V::Op\"))",
    "ops-math": "hicann/ops-math @c41933244c31e44fd496e3bb3212164f8c48c214 (the same, math and conversion ops)",
    "ops-cv": "hicann/ops-cv @6ae87653464d2afb064c829e529abba2e278b0c4 (the same, vision ops)",
    "GE-parser": "hicann/ge @ffdcbc9f7496c17a98c1d12762c61ed608ef3503 parser/parser/onnx/onnx_parser.cc: Constant is "
                 "built in (kOnnxOpMap); any other node is looked up as 'ai.onnx::<the model's opset>::<op>' "
                 "(ConstructOriType) and an unregistered one fails with E16002 (AdapterOpType)",
    "OPL": "CANN ONNX operator list (支持ONNX算子清单), CANN 9.0: hiascend.com/document/detail/zh/canncommercial/900/"
           "API/aolapi/atlasoxol_09_<page>.html; 8.0.RC2's overview (operatorlist_0004) says the list covers "
           "Atlas inference products (310P)",
}

# op -> (opset versions the parser registers for it, where). A model's single default-domain opset must
# be one of them. Generated from the OriginOpType lists of the three operator repositories (standard
# ONNX ops only; an op in several plugins: the first file, same versions).
OPSETS = {
    "Constant": ("1-99", "GE-parser"),
    "Abs": ("8-18", "ops-math:common/src/framework/similar_opp_onnx_plugin.cpp"),
    "Acos": ("8-18", "ops-math:common/src/framework/similar_opp_onnx_plugin.cpp"),
    "Acosh": ("8-18", "ops-math:common/src/framework/similar_opp_onnx_plugin.cpp"),
    "Add": ("8-18", "ops-math:common/src/framework/similar_opp_onnx_plugin.cpp"),
    "AffineGrid": ("8-16", "ops-cv:common/src/framework/affine_grid_onnx_plugin.cpp"),
    "And": ("8-18", "ops-math:common/src/framework/similar_opp_onnx_plugin.cpp"),
    "ArgMax": ("8-18", "ops-math:math/arg_max_v2/framework/argmax_onnx_plugin.cpp"),
    "ArgMin": ("8-18", "ops-math:math/arg_min/framework/argmin_onnx_plugin.cpp"),
    "Asin": ("8-18", "ops-math:common/src/framework/similar_opp_onnx_plugin.cpp"),
    "Asinh": ("8-18", "ops-math:common/src/framework/similar_opp_onnx_plugin.cpp"),
    "Atan": ("8-18", "ops-math:common/src/framework/similar_opp_onnx_plugin.cpp"),
    "Atanh": ("8-18", "ops-math:common/src/framework/similar_opp_onnx_plugin.cpp"),
    "AveragePool": ("8-18", "ops-nn:common/src/framework/average_pool_onnx_plugin.cpp"),
    "BatchNormalization": ("8-18", "ops-nn:norm/batch_norm/framework/batch_normalization_onnx_plugin.cpp"),
    "Bernoulli": ("15-18", "ops-math:random/stateless_bernoulli/framework/bernoulli_onnx_plugin.cpp"),
    "BitShift": ("11-18", "ops-math:math/right_shift/framework/bitshift_onnx_plugin.cpp"),
    "BitwiseAnd": ("18", "ops-math:common/src/framework/similar_opp_onnx_plugin.cpp"),
    "BitwiseNot": ("18", "ops-math:common/src/framework/similar_opp_onnx_plugin.cpp"),
    "BitwiseOr": ("18", "ops-math:common/src/framework/similar_opp_onnx_plugin.cpp"),
    "BitwiseXor": ("18", "ops-math:common/src/framework/similar_opp_onnx_plugin.cpp"),
    "Cast": ("8-18", "ops-math:math/cast/framework/cast_onnx_plugin.cpp"),
    "CastLike": ("15-18", "ops-math:common/src/framework/similar_opp_onnx_plugin.cpp"),
    "Ceil": ("8-18", "ops-math:common/src/framework/similar_opp_onnx_plugin.cpp"),
    "Celu": ("8-18", "ops-nn:activation/celu/framework/celu_onnx_plugin.cpp"),
    "Clip": ("8-18", "ops-math:conversion/clip_by_value/framework/clip_onnx_plugin.cpp"),
    "Col2Im": ("18", "ops-cv:common/src/framework/col2imv2_onnx_plugin.cpp"),
    "Compress": ("9-18", "ops-nn:index/gather_v2/framework/compress_onnx_plugin.cpp"),
    "Concat": ("8-18", "ops-math:conversion/concat/framework/concat_onnx_plugin.cpp"),
    "ConcatFromSequence": ("11-18", "ops-math:common/src/framework/concat_from_sequence_onnx_plugin.cpp"),
    "ConstantOfShape": ("8-18", "ops-nn:common/src/framework/constantofshape_onnx_plugin.cpp"),
    "Conv": ("8-18", "ops-nn:common/src/framework/conv_onnx_plugin.cpp"),
    "ConvTranspose": ("8-18", "ops-nn:common/src/framework/conv_transpose_onnx_plugin.cpp"),
    "Cos": ("8-18", "ops-math:common/src/framework/similar_opp_onnx_plugin.cpp"),
    "Cosh": ("8-18", "ops-math:common/src/framework/similar_opp_onnx_plugin.cpp"),
    "CumSum": ("8-18", "ops-math:math/cumsum/framework/cumsum_onnx_plugin.cpp"),
    "DepthToSpace": ("8-18", "ops-math:conversion/depth_to_space/framework/depth_to_space_onnx_plugin.cpp"),
    "Det": ("8-18", "ops-math:common/src/framework/similar_opp_onnx_plugin.cpp"),
    "Div": ("8-18", "ops-math:common/src/framework/similar_opp_onnx_plugin.cpp"),
    "Dropout": ("8-18", "ops-math:common/src/framework/similar_opp_onnx_plugin.cpp"),
    "Einsum": ("8-18", "ops-math:common/src/framework/einsum_onnx_plugin.cpp"),
    "Elu": ("8-18", "ops-nn:activation/elu/framework/elu_onnx_plugin.cpp"),
    "Equal": ("8-18", "ops-math:common/src/framework/similar_opp_onnx_plugin.cpp"),
    "Erf": ("8-18", "ops-math:common/src/framework/similar_opp_onnx_plugin.cpp"),
    "Exp": ("8-18", "ops-math:common/src/framework/similar_opp_onnx_plugin.cpp"),
    "Expand": ("8-18", "ops-math:common/src/framework/similar_opp_onnx_plugin.cpp"),
    "EyeLike": ("8-18", "ops-math:common/src/framework/eyelike_onnx_plugin.cpp"),
    "Flatten": ("8-18", "ops-math:conversion/flatten/framework/flatten_onnx_plugin.cpp"),
    "Floor": ("8-18", "ops-math:common/src/framework/similar_opp_onnx_plugin.cpp"),
    "GRU": ("8-18", "ops-nn:common/src/framework/gru_onnx_plugin.cpp"),
    "Gather": ("8-18", "ops-nn:index/gather_v2/framework/gather_onnx_plugin.cpp"),
    "GatherElements": ("8-18", "ops-nn:index/gather_elements/framework/gather_elements_onnx_plugin.cpp"),
    "GatherND": ("8-18", "ops-nn:index/gather_nd/framework/gather_nd_onnx_plugin.cpp"),
    "Gemm": ("8-18", "ops-nn:common/src/framework/gemm_onnx_plugin.cpp"),
    "GlobalAveragePool": ("8-18", "ops-math:common/src/framework/similar_opp_onnx_plugin.cpp"),
    "GlobalLpPool": ("8-18", "ops-nn:common/src/framework/global_lppool_onnx_plugin.cpp"),
    "GlobalMaxPool": ("8-18", "ops-nn:common/src/framework/global_max_pool_onnx_plugin.cpp"),
    "Greater": ("8-18", "ops-math:common/src/framework/similar_opp_onnx_plugin.cpp"),
    "GreaterOrEqual": ("8,12-18", "ops-math:common/src/framework/similar_opp_onnx_plugin.cpp"),
    "GridSample": ("11,16-18", "ops-cv:image/grid_sample/framework/grid_sample_onnx_plugin.cpp"),
    "HardSigmoid": ("1,6,8-18", "ops-nn:activation/hard_sigmoid/framework/hard_sigmoid_onnx_plugin.cpp"),
    "HardSwish": ("14-18", "ops-math:common/src/framework/similar_opp_onnx_plugin.cpp"),
    "Hardmax": ("8-18", "ops-nn:common/src/framework/hardmax_onnx_plugin.cpp"),
    "Identity": ("8-18", "ops-math:common/src/framework/similar_opp_onnx_plugin.cpp"),
    "If": ("8-18", "ops-nn:common/src/framework/if_onnx_plugin.cpp"),
    "InstanceNormalization": ("8-18", "ops-nn:norm/instance_norm_v3/framework/instancenormalization_onnx_plugin.cpp"),
    "IsInf": ("10-18", "ops-math:math/is_inf/framework/isinf_onnx_plugin.cpp"),
    "IsNaN": ("9-18", "ops-math:common/src/framework/similar_opp_onnx_plugin.cpp"),
    "LRN": ("8-18", "ops-nn:common/src/framework/lrn_onnx_plugin.cpp"),
    "LSTM": ("8-18", "ops-nn:common/src/framework/lstm_onnx_plugin.cpp"),
    "LayerNormalization": ("17-18", "ops-nn:common/src/framework/layer_normalization_onnx_plugin.cpp"),
    "LeakyRelu": ("8-18", "ops-nn:activation/leaky_relu/framework/leaky_relu_onnx_plugin.cpp"),
    "Less": ("8-18", "ops-math:common/src/framework/similar_opp_onnx_plugin.cpp"),
    "LessOrEqual": ("8-18", "ops-math:common/src/framework/similar_opp_onnx_plugin.cpp"),
    "Log": ("8-18", "ops-math:common/src/framework/similar_opp_onnx_plugin.cpp"),
    "LogSoftmax": ("8-18", "ops-nn:activation/log_softmax_v2/framework/logsoftmax_onnx_plugin.cpp"),
    "LpNormalization": ("1,8-18", "ops-nn:norm/lp_norm_v2/framework/lp_normalization_onnx_plugin.cpp"),
    "LpPool": ("8-18", "ops-nn:common/src/framework/lppool_onnx_plugin.cpp"),
    "MatMul": ("8-18", "ops-nn:matmul/mat_mul_v3/framework/matmul_onnx_plugin.cpp"),
    "Max": ("8-18", "ops-math:experimental/math/asinh/framework/max_onnx_plugin.cpp"),
    "MaxPool": ("8-18", "ops-nn:common/src/framework/max_pool_onnx_plugin.cpp"),
    "MaxRoiPool": ("1,8-18", "ops-cv:common/src/framework/max_roi_pool_onnx_plugin.cpp"),
    "MaxUnpool": ("9,11-18", "ops-nn:common/src/framework/maxunpool_onnx_plugin.cpp"),
    "Mean": ("8-18", "ops-math:math/accumulate_nv2/framework/mean_onnx_plugin.cpp"),
    "MeanVarianceNormalization": ("9-18", "ops-nn:common/src/framework/mean_variance_normalization_onnx_plugin.cpp"),
    "Min": ("8-18", "ops-math:math/minimum/framework/min_onnx_plugin.cpp"),
    "Mish": ("18", "ops-nn:activation/mish/framework/mish_onnx_plugin.cpp"),
    "Mod": ("10-18", "ops-math:math/mod/framework/mod_onnx_plugin.cpp"),
    "Mul": ("8-18", "ops-math:common/src/framework/similar_opp_onnx_plugin.cpp"),
    "Multinomial": ("8-18", "ops-math:random/stateless_sample_multinomial/framework/multinomial_onnx_plugin.cpp"),
    "Neg": ("8-18", "ops-math:common/src/framework/similar_opp_onnx_plugin.cpp"),
    "NonMaxSuppression": ("10-18", "ops-cv:objdetect/non_max_suppression_v6/framework/non_max_suppression_onnx_plugin.cpp"),
    "NonZero": ("9-18", "ops-nn:index/non_zero/framework/non_zero_onnx_plugin.cpp"),
    "Not": ("8-18", "ops-math:common/src/framework/similar_opp_onnx_plugin.cpp"),
    "OneHot": ("9-18", "ops-math:math/one_hot/framework/onehot_onnx_plugin.cpp"),
    "Or": ("8-18", "ops-math:common/src/framework/similar_opp_onnx_plugin.cpp"),
    "PRelu": ("8-18", "ops-math:common/src/framework/similar_opp_onnx_plugin.cpp"),
    "Pad": ("8-18", "ops-math:conversion/pad_v3/framework/pad_onnx_plugin.cpp"),
    "Pow": ("8-18", "ops-math:common/src/framework/similar_opp_onnx_plugin.cpp"),
    "RandomNormal": ("8-18", "ops-math:random/stateless_random_normal_v2/framework/random_normal_onnx_plugin.cpp"),
    "RandomNormalLike": ("8-18", "ops-math:common/src/framework/random_normal_like_onnx_plugin.cpp"),
    "RandomUniform": ("8-18", "ops-math:random/dsa_random_uniform/framework/random_uniform_onnx_plugin.cpp"),
    "RandomUniformLike": ("8-18", "ops-math:common/src/framework/random_uniform_like_onnx_plugin.cpp"),
    "Range": ("8-18", "ops-math:common/src/framework/similar_opp_onnx_plugin.cpp"),
    "Reciprocal": ("8-18", "ops-math:common/src/framework/similar_opp_onnx_plugin.cpp"),
    "ReduceL1": ("8-17", "ops-math:common/src/framework/reduceL1_onnx_plugin.cpp"),
    "ReduceL2": ("8-17", "ops-math:common/src/framework/reduceL2_onnx_plugin.cpp"),
    "ReduceLogSum": ("8-18", "ops-math:math/reduce_sum/framework/reduce_log_sum_onnx_plugin.cpp"),
    "ReduceLogSumExp": ("8-18", "ops-math:math/reduce_log_sum_exp/framework/reduce_log_sum_exp_onnx_plugin.cpp"),
    "ReduceMax": ("8-18", "ops-math:math/reduce_max/framework/reduce_max_onnx_plugin.cpp"),
    "ReduceMean": ("8-18", "ops-math:math/reduce_mean/framework/reduce_mean_onnx_plugin.cpp"),
    "ReduceMin": ("8-18", "ops-math:math/reduce_min/framework/reduce_min_onnx_plugin.cpp"),
    "ReduceProd": ("8-18", "ops-math:math/reduce_prod/framework/reduce_prod_onnx_plugin.cpp"),
    "ReduceSum": ("8-18", "ops-math:math/reduce_sum/framework/reduce_sum_onnx_plugin.cpp"),
    "ReduceSumSquare": ("1,8-18", "ops-math:math/square_sum_v1/framework/reduce_sum_square_onnx_plugin.cpp"),
    "Relu": ("8-18", "ops-math:common/src/framework/similar_opp_onnx_plugin.cpp"),
    "Reshape": ("8-18", "ops-math:conversion/reshape/framework/reshape_onnx_plugin.cpp"),
    "Resize": ("10-18", "ops-nn:common/src/framework/resize_onnx_plugin.cpp"),
    "ReverseSequence": ("10-18", "ops-math:common/src/framework/reverseSequence_onnx_plugin.cpp"),
    "RoiAlign": ("8-18", "ops-cv:objdetect/roi_align/framework/roi_align_onnx_plugin.cpp"),
    "Round": ("8-18", "ops-math:common/src/framework/similar_opp_onnx_plugin.cpp"),
    "Scatter": ("9-11", "ops-nn:index/scatter_elements/framework/scatter_elements_onnx_plugin.cpp"),
    "ScatterElements": ("11-18", "ops-nn:index/scatter_elements/framework/scatter_elements_onnx_plugin.cpp"),
    "ScatterND": ("8-18", "ops-math:common/src/framework/similar_opp_onnx_plugin.cpp"),
    "Selu": ("8-18", "ops-nn:activation/selu/framework/selu_onnx_plugin.cpp"),
    "SequenceAt": ("11-18", "ops-math:common/src/framework/sequence_onnx_plugin.cpp"),
    "SequenceConstruct": ("11-18", "ops-math:common/src/framework/sequence_onnx_plugin.cpp"),
    "SequenceEmpty": ("11-18", "ops-math:common/src/framework/sequence_onnx_plugin.cpp"),
    "SequenceErase": ("11-18", "ops-math:common/src/framework/sequence_onnx_plugin.cpp"),
    "SequenceInsert": ("11-18", "ops-math:common/src/framework/sequence_onnx_plugin.cpp"),
    "SequenceLength": ("11-18", "ops-math:common/src/framework/sequence_onnx_plugin.cpp"),
    "Shape": ("8-18", "ops-math:math/shape/framework/shape_onnx_plugin.cpp"),
    "Shrink": ("9-18", "ops-nn:activation/shrink/framework/shrink_onnx_plugin.cpp"),
    "Sigmoid": ("8-18", "ops-math:common/src/framework/similar_opp_onnx_plugin.cpp"),
    "Sign": ("8-18", "ops-math:common/src/framework/similar_opp_onnx_plugin.cpp"),
    "Sin": ("8-18", "ops-math:common/src/framework/similar_opp_onnx_plugin.cpp"),
    "Sinh": ("8-18", "ops-math:common/src/framework/similar_opp_onnx_plugin.cpp"),
    "Size": ("8-18", "ops-nn:common/src/framework/size_onnx_plugin.cpp"),
    "Slice": ("8-18", "ops-math:conversion/strided_slice_v2/framework/slice_onnx_plugin.cpp"),
    "Softmax": ("8-18", "ops-nn:activation/softmax_v2/framework/softmax_onnx_plugin.cpp"),
    "SoftmaxCrossEntropyLoss": ("12-18", "ops-nn:common/src/framework/softmax_cross_entropy_loss_onnx_plugin.cpp"),
    "Softplus": ("8-18", "ops-math:common/src/framework/similar_opp_onnx_plugin.cpp"),
    "Softsign": ("8-18", "ops-math:common/src/framework/similar_opp_onnx_plugin.cpp"),
    "SpaceToDepth": ("8-18", "ops-math:conversion/space_to_depth/framework/space_to_depth_onnx_plugin.cpp"),
    "Split": ("8-18", "ops-math:conversion/split_d/framework/split_onnx_plugin.cpp"),
    "SplitToSequence": ("11-18", "ops-math:common/src/framework/split_to_sequence_onnx_plugin.cpp"),
    "Sqrt": ("8-18", "ops-math:common/src/framework/similar_opp_onnx_plugin.cpp"),
    "Squeeze": ("8-18", "ops-math:conversion/squeeze/framework/squeeze_onnx_plugin.cpp"),
    "Sub": ("8-18", "ops-math:common/src/framework/similar_opp_onnx_plugin.cpp"),
    "Sum": ("8-18", "ops-math:math/accumulate_nv2/framework/sum_onnx_plugin.cpp"),
    "Tan": ("8-18", "ops-math:common/src/framework/similar_opp_onnx_plugin.cpp"),
    "Tanh": ("8-18", "ops-math:common/src/framework/similar_opp_onnx_plugin.cpp"),
    "ThresholdedRelu": ("10-18", "ops-nn:activation/threshold/framework/threshold_relu_onnx_plugin.cpp"),
    "Tile": ("8-18", "ops-math:common/src/framework/similar_opp_onnx_plugin.cpp"),
    "TopK": ("8-18", "ops-nn:common/src/framework/topk_onnx_plugin.cpp"),
    "Transpose": ("8-18", "ops-math:conversion/transpose/framework/transpose_onnx_plugin.cpp"),
    "Trilu": ("14-18", "ops-math:conversion/trilu/framework/trilu_onnx_plugin.cpp"),
    "Unique": ("11-18", "ops-nn:index/unique_with_counts_and_sorting/framework/unique_onnx_plugin.cpp"),
    "Unsqueeze": ("8-18", "ops-math:conversion/unsqueeze/framework/unsequeeze_onnx_plugin.cpp"),
    "Upsample": ("8-9,11-16", "ops-cv:common/src/framework/upsample_onnx_plugin.cpp"),
    "Where": ("8-18", "ops-math:common/src/framework/similar_opp_onnx_plugin.cpp"),
    "Xor": ("8-18", "ops-math:math/bitwise_xor/framework/xor_onnx_plugin.cpp"),
}

# Einsum: "目前ONNX的einsum只支持双输入的20种情况" [OPL 0052], written here with their letters renamed in order
# of first appearance (canonical form; that ATC matches equations up to renaming is [unconfirmed]).
EINSUM_EQUATIONS = (
    "abc,cde->abde", "abcd,aecd->aceb", "abcd,adbe->acbe", "abcd,cde->abe", "abc,cd->abd", "abc,dc->abd",
    "abc,abd->dc", "abc,dec->abde", "abc,abde->dec", "abcd,aecd->acbe", "abcd,acbe->aecd", "abcd,ecd->abe",
    "abcd,abe->ecd", "abcd,acbe->adbe", "abcd,abde->abce", "abcd,abce->abde", "abcd,aebd->aebc",
    "abcd,abce->acde", "abc,abd->acd", "ab,cb->ac",
)


@dataclass(frozen=True)
class Limit:
    """One attribute limit: ``allowed`` values of ``attribute`` (its default when absent), the error code
    the check reports, its source and why."""

    op: str
    attribute: str
    default: str
    allowed: tuple[str, ...]
    code: str
    source: str
    why: str


LIMITS = (
    Limit("RoiAlign", "mode", "avg", ("avg",), "E16002",
          "ops-cv:objdetect/roi_align/framework/roi_align_onnx_plugin.cpp",
          "the plugin drops `mode`; ROIAlign's pool_mode defaults to avg, so max would silently run as avg "
          "(the fake atc is stricter than ATC here)"),
    Limit("RoiAlign", "coordinate_transformation_mode", "half_pixel", ("half_pixel", "output_half_pixel"), "E16002",
          "ops-cv:objdetect/roi_align/framework/roi_align_onnx_plugin.cpp",
          "opset >= 16: half_pixel -> roi_end_mode 2 (PyTorch aligned=True), output_half_pixel -> roi_end_mode 0 "
          "(aligned=False); opset < 16: always 0"),
    Limit("ScatterND", "reduction", "none", ("none", "add", "max", "min"), "E16002",
          "ops-nn:common/src/framework/scatter_nd_onnx_plugin.cpp", "reduction='mul' is not supported"),
    Limit("Resize", "mode", "nearest", ("nearest", "linear"), "EZ9999", "OPL 0131 (8.0.RC3)",
          "only nearest and linear interpolation (5-D inputs: linear only)"),
)
# Inputs that must be constants: "需要修改模型将输入scales或sizes由placeholder改为const类型" [OPL 0131 (8.0.RC3)].
# Checked as "computed from constants and input shapes only", what ATC folds once --input_shape fixes the
# shapes (the fold itself is [unconfirmed]).
CONSTANT_INPUTS = {"Resize": (1, 2, 3)}


@dataclass(frozen=True)
class Problem:
    node: str
    op: str
    code: str  # the ATC error code it would fail with
    message: str


def versions(spec: str) -> set[int]:
    """"8,12-18" -> {8, 12, ..., 18}."""
    out: set[int] = set()
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


DEFAULT_DOMAINS = ("", "ai.onnx")  # the standard ONNX operator set, under either of its names


def walk_nodes(graph):
    """Every node, including those inside If/Loop/Scan bodies."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.g.node:
                yield from walk_nodes(attr.g)
            for sub in attr.graphs:
                yield from walk_nodes(sub)


def _attributes(node) -> dict:
    import onnx

    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute
            if a.type not in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)}


def _attribute_problems(node, opset: int) -> list[Problem]:
    attrs = _attributes(node)
    found = []
    for limit in LIMITS:
        if limit.op != node.op_type:
            continue
        value = attrs.get(limit.attribute, limit.default)
        value = value.decode() if isinstance(value, bytes) else str(value)
        if value not in limit.allowed:
            found.append(Problem(node.name, node.op_type, limit.code, f"{limit.attribute}={value!r}: {limit.why} "
                                 f"(allowed: {', '.join(limit.allowed)}) [{limit.source}]"))
    if node.op_type == "Einsum":
        equation = attrs.get("equation", b"")
        equation = equation.decode() if isinstance(equation, bytes) else equation
        if canonical_equation(equation) not in EINSUM_EQUATIONS:
            found.append(Problem(node.name, "Einsum", "EZ9999", f"equation {equation!r} (as "
                                 f"{canonical_equation(equation)!r}) is not one of the 20 two-input equations ATC's "
                                 "Einsum supports [OPL 0052]; rewrite it as MatMul"))
    return found


def _shape_only(model) -> set[str]:
    """Tensors computed from constants and input shapes only (Shape / Size cut the dependence on an
    input's values): what ATC can fold once --input_shape fixes every shape."""
    known = {i.name for i in model.graph.initializer}
    for node in model.graph.node:  # topological order (an ONNX requirement)
        if node.op_type in ("Constant", "Shape", "Size") or all(not i or i in known for i in node.input):
            known.update(o for o in node.output if o)
    return known


def _opset(model) -> int | None:
    return next((o.version for o in model.opset_import if o.domain in DEFAULT_DOMAINS), None)


def problems(model) -> list[Problem]:
    """Every node of ``model`` (subgraphs included) ATC would not parse or compile as it stands."""
    opset = _opset(model)
    folded = _shape_only(model)
    found = []
    for node in walk_nodes(model.graph):
        if node.domain not in DEFAULT_DOMAINS:
            found.append(Problem(node.name, node.op_type, "E19010", f"No parser is registered for Op [{node.name}, "
                                 f"optype [{node.domain}::{node.op_type}]] [GE-parser]"))
            continue
        entry = OPSETS.get(node.op_type)
        if entry is None or opset not in versions(entry[0]):
            where = f"ai.onnx::{opset}::{node.op_type}"
            hint = f"; registered for opsets {entry[0]} [{entry[1]}]" if entry else ""
            found.append(Problem(node.name, node.op_type, "E16002", f"op type [{where}] has no ONNX parser{hint}"))
            continue
        found.extend(_attribute_problems(node, opset))
        for index in CONSTANT_INPUTS.get(node.op_type, ()):
            name = node.input[index] if index < len(node.input) else ""
            if name and name not in folded:
                found.append(Problem(node.name, node.op_type, "EZ9999", f"input {index} ({name}) depends on input "
                                     "data; ATC needs scales/sizes that are constants once shapes are fixed [OPL 0131]"))
    return found
