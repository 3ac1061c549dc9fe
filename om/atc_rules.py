"""What ATC accepts on its command line, as data with a source per entry: the SoC names, the limits of
the gear options. om.plan refuses plans outside them and the fake atc (sam3track.testing.fake_atc)
refuses command lines outside them. Sources and what they leave open: docs/ascend.md, "What the fake
atc checks".
"""

from __future__ import annotations

# --soc_version: "Ascend" + the Chip Name npu-smi shows (A3: Chip Name_NPU Name) [D-soc]. The values
# graphengine itself knows, from its SoC capability table
# [GE-soc: hicann/ge @ffdcbc9 compiler/engines/hccl_engine/hcom_graph_adaptor/ge_plugin/common/device_capability.cc].
SOC_VERSIONS = {
    # Atlas inference series (310P) [GE-soc]
    "Ascend310P1": "GE-soc", "Ascend310P3": "GE-soc", "Ascend310P5": "GE-soc", "Ascend310P7": "GE-soc",
    # Atlas 200I/500 A2 [GE-soc; D-soc 6.2.RC1 example --soc_version=Ascend310B1]
    "Ascend310B1": "GE-soc",
    # Atlas 200/300/500 inference (310) [D-soc 6.0.RC1: "昇腾310 AI处理器参数值: Ascend310"]
    "Ascend310": "D-soc",
    # Atlas training series (910) [GE-soc]. GE-soc also maps a bare "Ascend910B" (to the 910 class); it is a
    # family, not a Chip Name npu-smi shows [D-soc], so it is left out [unconfirmed that ATC refuses it]
    "Ascend910": "GE-soc", "Ascend910A": "GE-soc", "Ascend910ProA": "GE-soc", "Ascend910ProB": "GE-soc",
    "Ascend910PremiumA": "GE-soc",
    # Atlas A2 (910B) [GE-soc]
    "Ascend910B1": "GE-soc", "Ascend910B2": "GE-soc", "Ascend910B2C": "GE-soc", "Ascend910B3": "GE-soc",
    "Ascend910B4": "GE-soc", "Ascend910B4-1": "GE-soc",
    # Atlas A3 (910_93) [GE-soc; D-soc 9.0: Chip Name_NPU Name]
    "Ascend910_9391": "GE-soc", "Ascend910_9381": "GE-soc", "Ascend910_9392": "GE-soc", "Ascend910_9382": "GE-soc",
    "Ascend910_9372": "GE-soc", "Ascend910_9362": "GE-soc",
    # Ascend 950 [GE-soc]
    "Ascend950": "GE-soc",
}
# SoCs of Atlas A2/A3, where mixed_bfloat16 is documented [D-pm2]
BF16_SOCS = tuple(s for s in SOC_VERSIONS if s.startswith(("Ascend910B", "Ascend910_93")))

# --dynamic_batch_size gears and --dynamic_dims profiles: (1, 100] [D-dims, D-batch; the minimum 2 also in
# GE-mbo CheckDynamicParams, E10035]; Ascend 950 allows 256 [D-dims 9.1]: not planned for here.
MIN_PROFILES, MAX_PROFILES = 2, 100
# --dynamic_dims: "每档最多支持任意指定4个维度" (at most 4 dims, i.e. -1 values, per profile) and
# "ND表示支持任意格式，当前N<=4" (inputs of rank <= 4) [D-dims4: ATC --dynamic_dims pages of CANN 6.0.1, 7.0, 8.0.RC1/RC2 and
# Atlas 200I DK A2 23.0.RC2; the AOE page keeps "up to 4-dimensional" up to CANN 9.0]. The ATC pages of
# 8.0.0 and later drop both sentences and graphengine's option checks (GE-opt) enforce neither; a plan
# within them converts on every release, so both are enforced.
MAX_DIMS_PER_PROFILE = 4
MAX_DIMS_INPUT_RANK = 4

SOURCES = {
    "D-soc": "ATC --soc_version: hiascend.com/document/detail/zh/canncommercial/900/devaids/atctool/"
             "atlasatcparam_16_0036.html; 6.0.RC1 .../60RC1/inferapplicationdev/atctool/atctool_0064.html",
    "GE-soc": "hicann/ge @ffdcbc9496c17a98c1d12762c61ed608ef3503, compiler/engines/hccl_engine/hcom_graph_adaptor/"
              "ge_plugin/common/device_capability.cc (kSocMap)",
    "D-dims": "ATC --dynamic_dims: .../canncommercial/800/devaids/atc/atlasatcparam_16_0020.html",
    "D-batch": "ATC --dynamic_batch_size: .../canncommercial/800/devaids/atc/atlasatcparam_16_0018.html",
    "D-dims4": "ATC --dynamic_dims, CANN 8.0.RC2: hiascend.com/document/detail/zh/canncommercial/80RC2/devaids/"
               "auxiliarydevtool/atlasatc_16_0054.html; 6.0.1: .../canncommercial/601/inferapplicationdev/atctool/"
               "atctool_0056.html; AOE 9.0: .../canncommercial/900/devaids/aoe/aoepar_16_013.html",
    "D-pm2": "ATC --precision_mode_v2: .../canncommercial/800/devaids/atc/atlasatcparam_16_0069.html",
    "GE-mbo": "hicann/ge @ffdcbc9, compiler/graph/preprocess/multi_batch_options.cc (CheckDynamicParams: E10035 "
              "fewer than 2, E10037 unequal sizes, E10038 negative, E10039 duplicate profiles)",
    "GE-opt": "hicann/ge @ffdcbc9, compiler/api/aclgrph/option_utils.cc (CheckAndParseDynamicDims: values per "
              "profile = number of -1, E10003; E10009 mutually exclusive dynamic options)",
}


def soc_problem(soc: str) -> str | None:
    """Why ``soc`` is not a --soc_version ATC knows, or None."""
    if soc in SOC_VERSIONS:
        return None
    near = [s for s in SOC_VERSIONS if s.lower() == soc.lower() or s.startswith(soc)]
    hint = f" (did you mean {', '.join(near[:4])}?)" if near else ""
    return (f"{soc!r} is not a SoC ATC knows{hint}: write 'Ascend' + the Chip Name npu-smi info shows "
            f"(A3: Chip Name_NPU Name), one of {', '.join(sorted(SOC_VERSIONS))}")
