"""Run Meta's SAM 3.1 video predictor (facebookresearch/sam3 @ 96914d2, unmodified) on CPU in fp32.

Runs only inside the reference env (``build_env.py``); never imported by the project's runtime.

    import shim
    shim.install(numerics)                          # before anything from sam3 is imported
    pred = shim.build_predictor(config=shim.SMALL, seed=0)              # random weights
    pred = shim.build_predictor(config=..., checkpoint_path="sam3.1_multiplex.pt")   # Meta's loader

Zero edits to Meta's files: every change is a runtime patch listed here, with the reason it exists.
Each patch that rewrites a call counts itself in ``REWRITES`` (call site -> hits), so a run records which
CUDA assumptions it actually met.

P1  torch.cuda.get_device_properties -> stand-in properties (major=0) when CUDA is absent.
    sam3/model/sam3_multiplex_base.py:36 calls it unconditionally at import time.
P2  CudaToCpu TorchFunctionMode on the main thread: ``device="cuda"`` kwargs and ``Tensor.to(cuda)``
    go to the CPU, ``Tensor.cuda()`` / ``.pin_memory()`` are identities, ``pin_memory=True`` is dropped.
    Meta places tensors on CUDA explicitly all over (position_encoding.py:55, decoder.py:301,
    video_tracking_multiplex*.py, sam3_multiplex_tracking.py, io_utils.py ``.cuda()`` on frames).
P3  nn.Module.cuda -> identity (the builder calls ``demo_model.cuda()``).
P4  torch.autocast(device_type="cuda") -> a no-op context. The predictor enters a *global* bf16
    autocast in __init__ and wraps add_prompt in one; on a CUDA-less torch that is already a warning
    and a no-op, this makes fp32 explicit.
P5  model_builder.download_ckpt_from_hf -> None: the builder downloads facebook/sam3.1 when no
    checkpoint is given; here the weights are random (make_checkpoint.py) or a local file.
P6  model.init_state drops kwargs its signature lacks. Upstream bug: Sam3BasePredictor.start_session
    (sam3_base_predictor.py:127-136) always passes ``offload_state_to_cpu=`` to init_state, which the
    3.1 model (sam3_multiplex_tracking.py:2218) does not accept -> TypeError on every start_session,
    on any device. ``offload_state_to_cpu=True`` is refused loudly (it cannot be honoured).
P7  builder arguments use_fa3=False, use_rope_real=False (FlashAttention-3 is CUDA-only),
    async_loading_frames=False (the async loader calls .cuda() on a worker thread, where the
    thread-local P2 mode is not active), compile=False.
P8a ViT MLP fc1+GELU (sam3/perflib/fused.py addmm_act, used whenever grad is off): Meta hard-casts
    input, weight and bias to bf16 and calls aten._addmm_activation, independent of autocast (on
    CPU it crashes: dtype mismatch). Numerics option ``vit_mlp``:
      "fp32" (default): act(fc1(x)) in fp32 with the module's own activation (exact GELU).
      "bf16": inputs, weight and bias rounded to bf16, product in fp32, tanh-GELU, result rounded to
              bf16. An *emulation* of the GPU kernel (its epilogue GELU is believed to be the tanh
              form; unverified), for studying the size of the effect, not bit-parity with a GPU.
    Default fp32 because the GPU kernel cannot be reproduced bit for bit on a CPU anyway.
P8b explicit ``.to(torch.bfloat16)`` storage casts (memories ``maskmem_features`` stored bf16,
    video_tracking_multiplex_demo.py:2820/2919; the interactive and propagation FPN levels cast to bf16
    "for all-gather", sam3_multiplex_detector.py:566/586). On a CPU a real bf16 tensor would then flow
    into fp32 ops and fail, so the cast is kept fp32. Numerics option ``bf16_storage``:
      "round" (default): the values are rounded through bf16 and returned as fp32, i.e. exactly the
              values Meta stores on a GPU. Rounding fp32 -> bf16 is round-to-nearest-even, a pure
              function of the input, so this is deterministic and device-independent.
      "fp32": kept in fp32 (a pure-fp32 reference).
P9  Sam3MultiplexDetector.forward_video_grounding_batched_multigpu gets max_frame_num_to_track+1.
    Upstream bug: _get_processing_order propagates start..start+max *inclusive*, the batched
    grounding computes valid_frame_end = start+max *exclusive*, so the last frame's slice is empty and
    sam3_multiplex_base.py:541 asserts whenever a propagate request sets max_frame_num_to_track short
    of the clip end.
P10 the model is built with torch.empty -> torch.zeros, then parameters Meta never initialises get a
    seeded N(0, 0.02): text ``positional_embedding`` (text_encoder_ve.py:201), ``text_projection``
    (:224), ``level_embed`` (encoder.py:290), ``bias_k/v`` (model_misc.py:544). The checkpoint fills
    them in real use; with random weights the garbage memory made every detector score NaN and would
    break determinism. Initialised parameters are overwritten by their own init (RNG stream unchanged).
SMALL  a small config (see SMALL below) by replacing the builder's private factory functions and the
    literal image_size=1008 it passes to two constructors; Meta's builders themselves run unchanged.
FRAMES Meta's loaders are used unchanged: the scripts hand it a folder of lossless PNG frames.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import inspect
import os
import sys
import types
import warnings
from pathlib import Path


def _ensure_sam3_on_path() -> None:
    """Meta's source is extracted beside the venv (env-<key>/sam3-src); no install, no edits."""
    try:
        import sam3  # noqa: F401
        return
    except ImportError:
        pass
    src = Path(sys.prefix).parent / "sam3-src"
    if not (src / "sam3" / "__init__.py").is_file():
        raise ImportError(f"Meta's sam3 package not found at {src}; run these scripts with the "
                          f"reference env's python (python -m reference.sam31.build_env prints it)")
    sys.path.insert(0, str(src))


_ensure_sam3_on_path()

import torch  # noqa: E402
from torch.overrides import TorchFunctionMode  # noqa: E402

# ------------------------------------------------------------------------------------------ config
# The small config. Full SAM 3.1 values in comments; everything not listed stays at Meta's value
# (tri-neck scales [4,2,1], multiplex_count 16, decoupled 8-head RoPE memory attention, num_maskmem 7,
# d_model 256 downstream of the trunk, 200 DETR queries, text context 32 and vocab 49408).
SMALL = dict(
    image_size=224,          # 1008  -> backbone grid 16x16 (72x72); stride 14 unchanged
    vit_embed_dim=256,       # 1024
    vit_num_heads=4,         # 16    (head dim 64 kept)
    vit_depth=2,             # 32
    vit_global_blocks=[1],   # (7, 15, 23, 31); block 0 windowed (24, 16 padded to 24), block 1 global
    text_width=256,          # 1024
    text_heads=4,            # 16
    text_layers=2,           # 24
    det_enc_layers=2,        # 6   (DETR fusion encoder)
    det_dec_layers=2,        # 6   (DETR decoder, 200 queries kept)
    memattn_layers=4,        # 4   (kept)
)
CONFIG_KEYS = tuple(SMALL)

DEFAULT_NUMERICS = dict(vit_mlp="fp32", bf16_storage="round")
NUMERICS = dict(DEFAULT_NUMERICS)

REWRITES: "collections.Counter[str]" = collections.Counter()
_TORCH_DIR = os.path.dirname(torch.__file__)
_SELF = os.path.abspath(__file__)


def _caller() -> str:
    """First frame outside torch and this file: the Meta call site a rewrite served."""
    f = sys._getframe(2)
    while f is not None:
        fn = f.f_code.co_filename
        if not fn.startswith(_TORCH_DIR) and os.path.abspath(fn) != _SELF and "contextlib" not in fn:
            p = fn.split("/sam3/", 1)[-1] if "/sam3/" in fn else os.path.basename(fn)
            return f"{p}:{f.f_lineno}"
        f = f.f_back
    return "?"


# ------------------------------------------------------------------------------------------ P1
_real_gdp = torch.cuda.get_device_properties


def _fake_get_device_properties(device=None):
    if torch.cuda.is_available():
        return _real_gdp(device)
    return types.SimpleNamespace(major=0, minor=0, name="cpu (sam31 shim)", total_memory=0,
                                 multi_processor_count=0)


# ------------------------------------------------------------------------------------------ P2, P8b, P10
def _is_cuda(d) -> bool:
    if isinstance(d, torch.device):
        return d.type == "cuda"
    return isinstance(d, str) and d.startswith("cuda")


def _round_bf16(out):
    if isinstance(out, torch.Tensor) and out.is_floating_point():
        return out.to(torch.bfloat16).to(torch.float32)
    return out


class CudaToCpuMode(TorchFunctionMode):
    """P2 (CUDA placement -> CPU, pinning -> no-op), P8b (bf16 storage casts), P10 (empty -> zeros)."""

    _IDENT = {torch.Tensor.cuda, torch.Tensor.pin_memory}
    zero_empty = False  # P10: True only while the model is being built

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.zero_empty and func is torch.empty:
            func = torch.zeros
        if func in self._IDENT:
            REWRITES[f"{func.__name__}() @ {_caller()}"] += 1
            return args[0]
        if func is torch.Tensor.to and any(_is_cuda(a) for a in args[1:]):
            args = tuple("cpu" if _is_cuda(a) else a for a in args)
            REWRITES[f"to(cuda) @ {_caller()}"] += 1
        bf = False
        if func is torch.Tensor.to and any(a is torch.bfloat16 for a in args[1:]):
            args = tuple(torch.float32 if a is torch.bfloat16 else a for a in args)
            bf = True
        if kwargs.get("dtype") is torch.bfloat16:
            kwargs = dict(kwargs, dtype=torch.float32)
            bf = True
        if func is torch.Tensor.bfloat16:
            func, bf = torch.Tensor.float, True
        if "device" in kwargs and _is_cuda(kwargs["device"]):
            kwargs = dict(kwargs, device="cpu")
            REWRITES[f"{getattr(func, '__name__', func)}(device=cuda) @ {_caller()}"] += 1
        if kwargs.get("pin_memory"):
            kwargs = dict(kwargs, pin_memory=False)
            REWRITES[f"{getattr(func, '__name__', func)}(pin_memory=True) @ {_caller()}"] += 1
        if bf:
            mode = NUMERICS["bf16_storage"]
            REWRITES[f"{getattr(func, '__name__', func)}(bfloat16 -> {mode}) @ {_caller()}"] += 1
            out = func(*args, **kwargs)
            return _round_bf16(out) if mode == "round" else out
        return func(*args, **kwargs)


# ------------------------------------------------------------------------------------------ P4
class _NoAutocast(contextlib.ContextDecorator):
    """Stand-in for torch.autocast(device_type='cuda') on a CPU: does nothing (fp32)."""

    def __init__(self, *a, **k):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_real_autocast = torch.autocast


def _autocast(device_type, *a, **k):
    if device_type == "cuda" and not torch.cuda.is_available():
        return _NoAutocast()
    return _real_autocast(device_type, *a, **k)


# ------------------------------------------------------------------------------------------ P8a
def _addmm_act_fp32(activation, linear, mat1):
    y = torch.nn.functional.linear(mat1, linear.weight, linear.bias)
    if activation in (torch.nn.functional.relu, torch.nn.ReLU):
        return torch.nn.functional.relu(y)
    if activation in (torch.nn.functional.gelu, torch.nn.GELU):
        return torch.nn.functional.gelu(y)
    raise ValueError(f"unexpected activation {activation}")


def _addmm_act_bf16(activation, linear, mat1):
    r = lambda t: t.to(torch.bfloat16).to(torch.float32)  # noqa: E731
    y = torch.nn.functional.linear(r(mat1), r(linear.weight), r(linear.bias))
    if activation in (torch.nn.functional.relu, torch.nn.ReLU):
        return r(torch.nn.functional.relu(y))
    if activation in (torch.nn.functional.gelu, torch.nn.GELU):
        return r(torch.nn.functional.gelu(y, approximate="tanh"))
    raise ValueError(f"unexpected activation {activation}")


# ------------------------------------------------------------------------------------------ install
_INSTALLED = False
_MODE: CudaToCpuMode | None = None


def install(numerics: dict | None = None) -> dict:
    """Apply P1-P5 and P8 (P6, P9, P10 and the small config are applied by build_predictor).

    Call before importing sam3 modules (P1 must precede sam3_multiplex_base's import-time call).
    Returns the numerics in force."""
    global _INSTALLED, _MODE
    numerics = dict(DEFAULT_NUMERICS, **(numerics or {}))
    bad = {k: v for k, v in numerics.items() if k not in DEFAULT_NUMERICS}
    if bad:
        raise ValueError(f"unknown numerics options {sorted(bad)}; known: {sorted(DEFAULT_NUMERICS)}")
    if numerics["vit_mlp"] not in ("fp32", "bf16"):
        raise ValueError(f"numerics vit_mlp must be 'fp32' or 'bf16', got {numerics['vit_mlp']!r}")
    if numerics["bf16_storage"] not in ("round", "fp32"):
        raise ValueError(f"numerics bf16_storage must be 'round' or 'fp32', got "
                         f"{numerics['bf16_storage']!r}")
    if _INSTALLED:
        if numerics != NUMERICS:
            raise RuntimeError(f"shim already installed with numerics {NUMERICS}, asked {numerics}")
        return dict(NUMERICS)
    if "sam3.model.sam3_multiplex_base" in sys.modules:
        raise RuntimeError("install() must run before sam3's model modules are imported (P1)")
    if torch.cuda.is_available():
        raise RuntimeError("this shim is for CUDA-less CPU runs (a GPU was found)")
    NUMERICS.update(numerics)
    warnings.filterwarnings("ignore", message=".*CUDA is not available.*")
    torch.cuda.get_device_properties = _fake_get_device_properties          # P1
    _MODE = CudaToCpuMode()
    _MODE.__enter__()                                                         # P2 (main thread)
    torch.nn.Module.cuda = lambda self, *a, **k: self                         # P3
    torch.autocast = _autocast                                                # P4
    torch.amp.autocast = _autocast
    import sam3.model_builder as mb

    mb.download_ckpt_from_hf = _no_download                                   # P5
    import sam3.model.vitdet as vitdet

    vitdet.addmm_act = _addmm_act_fp32 if NUMERICS["vit_mlp"] == "fp32" else _addmm_act_bf16  # P8a
    _INSTALLED = True
    return dict(NUMERICS)


def _no_download(version="sam3"):
    REWRITES[f"download_ckpt_from_hf({version!r}) suppressed"] += 1
    return None


# ------------------------------------------------------------------------------------------ P6
def _patch_init_state(model) -> None:
    cls = type(model)
    if getattr(cls.init_state, "_shim", False):
        return
    orig = cls.init_state
    params = inspect.signature(orig).parameters

    @functools.wraps(orig)
    def init_state(self, *a, **k):
        if k.get("offload_state_to_cpu"):
            raise NotImplementedError("SAM 3.1 init_state has no offload_state_to_cpu")
        dropped = sorted(n for n in k if n not in params)
        if dropped:
            REWRITES[f"init_state: dropped kwargs {dropped}"] += 1
        return orig(self, *a, **{n: v for n, v in k.items() if n in params})

    init_state._shim = True
    cls.init_state = init_state


# ------------------------------------------------------------------------------------------ P9
def _patch_batched_grounding_off_by_one() -> None:
    from sam3.model.sam3_multiplex_detector import Sam3MultiplexDetector as D

    f = D.forward_video_grounding_batched_multigpu
    if getattr(f, "_shim", False):
        return

    @functools.wraps(f)
    def g(self, *a, **k):
        if k.get("max_frame_num_to_track") is not None:
            k["max_frame_num_to_track"] = k["max_frame_num_to_track"] + 1
            REWRITES["P9 batched grounding max_frame_num_to_track+1"] += 1
        return f(self, *a, **k)

    g._shim = True
    D.forward_video_grounding_batched_multigpu = g


# ------------------------------------------------------------------------------------------ P10
UNINIT_PARAM_SUFFIXES = ("positional_embedding",   # text_encoder_ve.py:201
                         "text_projection",        # text_encoder_ve.py:224 (proj_bias=False)
                         "level_embed",            # encoder.py:290 (only with >1 feature level)
                         "bias_k", "bias_v")       # model_misc.py:544-545 (add_bias_kv only)


def _init_uninitialised(model, seed: int) -> None:
    g = torch.Generator().manual_seed(seed + 12345)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith(UNINIT_PARAM_SUFFIXES):
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
                REWRITES[f"P10 seeded init of {n}{list(p.shape)}"] += 1
    bad = [n for n, p in model.named_parameters() if not torch.isfinite(p).all()]
    if bad:
        raise RuntimeError(f"non-finite parameters after init: {bad[:5]}")


# ------------------------------------------------------------------------------------------ small config
_APPLIED_CONFIG: dict | None = None


def check_config(cfg: dict) -> dict:
    cfg = dict(cfg)
    missing = [k for k in CONFIG_KEYS if k not in cfg]
    extra = [k for k in cfg if k not in CONFIG_KEYS]
    if missing or extra:
        raise ValueError(f"config: missing keys {missing}, unknown keys {extra}")
    if cfg["image_size"] % 14:
        raise ValueError(f"config image_size must be a multiple of 14 (patch size), got {cfg['image_size']}")
    cfg["vit_global_blocks"] = [int(b) for b in cfg["vit_global_blocks"]]
    return cfg


def vit_trunk(cfg: dict, image_size: int, compile_mode=None, use_fa3=False, use_rope_real=False):
    """Meta's ViT with Meta's arguments (model_builder.py:77-107) except the configured sizes; also built
    alone at a larger image_size by dump_modules.py, for a trunk of several windows."""
    from sam3.model.vitdet import ViT

    return ViT(
        img_size=image_size, pretrain_img_size=336, patch_size=14,
        embed_dim=cfg["vit_embed_dim"], depth=cfg["vit_depth"], num_heads=cfg["vit_num_heads"],
        mlp_ratio=4.625, norm_layer="LayerNorm", drop_path_rate=0.1, qkv_bias=True,
        use_abs_pos=True, tile_abs_pos=True, global_att_blocks=tuple(cfg["vit_global_blocks"]),
        rel_pos_blocks=(), use_rope=True, use_interp_rope=True, window_size=24,
        pretrain_use_cls_token=True, retain_cls_token=False, ln_pre=True, ln_post=False,
        return_interm_layers=False, bias_patch_embed=False, compile_mode=compile_mode,
        use_fa3=use_fa3, use_rope_real=use_rope_real,
    )


def _apply_config(cfg: dict) -> None:
    """Replace the builder's private factories so Meta's builders make the configured sizes."""
    global _APPLIED_CONFIG
    if _APPLIED_CONFIG is not None:
        if _APPLIED_CONFIG != cfg:
            raise RuntimeError("a different config is already applied in this process")
        return
    import sam3.model_builder as mb
    from sam3.model.sam3_multiplex_tracking import Sam3MultiplexTrackingWithInteractivity
    from sam3.model.text_encoder_ve import VETextEncoder
    from sam3.model.tokenizer_ve import SimpleTokenizer
    from sam3.model.video_tracking_multiplex_demo import Sam3VideoTrackingMultiplexDemo

    S = cfg["image_size"]
    F = S // 14

    def _create_vit_backbone(compile_mode=None, use_fa3=False, use_rope_real=False):
        return vit_trunk(cfg, S, compile_mode=compile_mode, use_fa3=use_fa3, use_rope_real=use_rope_real)

    def _create_text_encoder(bpe_path):
        return VETextEncoder(tokenizer=SimpleTokenizer(bpe_path=bpe_path), d_model=256,
                             width=cfg["text_width"], heads=cfg["text_heads"], layers=cfg["text_layers"])

    orig_pe = mb._create_position_encoding

    def _create_position_encoding(precompute_resolution=None):
        return orig_pe(precompute_resolution=S if precompute_resolution else None)

    @contextlib.contextmanager
    def kw_override(name, **over):
        """Temporarily make class ``name`` in model_builder's namespace force some constructor
        kwargs (Meta's factories pass literals sized for 1008 px)."""
        C = getattr(mb, name)

        def f(*a, **k):
            k.update(over)
            return C(*a, **k)

        setattr(mb, name, f)
        try:
            yield
        finally:
            setattr(mb, name, C)

    orig_enc, orig_dec = mb._create_transformer_encoder, mb._create_transformer_decoder
    orig_mm, orig_mt = mb._create_multiplex_maskmem_backbone, mb._create_multiplex_transformer

    def _create_transformer_encoder(use_fa3=False):
        with kw_override("TransformerEncoderFusion", num_layers=cfg["det_enc_layers"]):
            return orig_enc(use_fa3=use_fa3)

    def _create_transformer_decoder(use_fa3=False):
        # resolution=1008 is a literal there (boxRPB coordinate cache of 72x72)
        with kw_override("TransformerDecoder", resolution=S, num_layers=cfg["det_dec_layers"]):
            return orig_dec(use_fa3=use_fa3)

    def _create_multiplex_maskmem_backbone(multiplex_count=16):
        # interpol_size 1152 = 16*72: the four stride-2 convs must land on the FxF grid
        with kw_override("PositionEmbeddingSine", precompute_resolution=S), \
                kw_override("SimpleMaskDownSampler", interpol_size=[16 * F, 16 * F]):
            return orig_mm(multiplex_count=multiplex_count)

    def _create_multiplex_transformer(use_fa3=False, use_rope_real=False):
        with kw_override("SimpleRoPEAttention", feat_sizes=[F, F]), \
                kw_override("TransformerEncoderDecoupledCrossAttention",
                            num_layers=cfg["memattn_layers"]):
            return orig_mt(use_fa3=use_fa3, use_rope_real=use_rope_real)

    mb._create_vit_backbone = _create_vit_backbone
    mb._create_text_encoder = _create_text_encoder
    mb._create_position_encoding = _create_position_encoding
    mb._create_transformer_encoder = _create_transformer_encoder
    mb._create_transformer_decoder = _create_transformer_decoder
    mb._create_multiplex_maskmem_backbone = _create_multiplex_maskmem_backbone
    mb._create_multiplex_transformer = _create_multiplex_transformer

    # the literal image_size=1008 passed to the tracker model and the demo model
    for cls in (Sam3VideoTrackingMultiplexDemo, Sam3MultiplexTrackingWithInteractivity):
        orig = cls.__init__

        def __init__(self, *a, __orig=orig, **k):
            if "image_size" in k:
                k["image_size"] = S
            __orig(self, *a, **k)

        cls.__init__ = __init__
    _APPLIED_CONFIG = dict(cfg)


# ------------------------------------------------------------------------------------------ build
def bpe_path() -> str:
    """Meta's CLIP BPE vocabulary, the one the text encoder's tokenizer reads."""
    import sam3

    return str(Path(sam3.__file__).parent / "assets" / "bpe_simple_vocab_16e6.txt.gz")


def build_predictor(config: dict | None = None, seed: int = 0, checkpoint_path: str | None = None,
                    numerics: dict | None = None, **builder_kwargs):
    """Sam3MultiplexVideoPredictor from Meta's public builder ``build_sam3_predictor(version="sam3.1")``.

    config: the builder sizes (SMALL or a config JSON's content); None = full SAM 3.1 sizes.
    checkpoint_path: None = seeded random weights; a file = loaded by Meta's own loader.
    builder_kwargs: passed to the builder (e.g. max_num_objects=32)."""
    install(numerics)
    torch.manual_seed(seed)
    import sam3.model_builder as mb

    if config is not None:
        _apply_config(check_config(config))
    args = dict(checkpoint_path=checkpoint_path, bpe_path=bpe_path(), use_fa3=False,
                use_rope_real=False, async_loading_frames=False, compile=False, warm_up=False)  # P7
    args.update(builder_kwargs)
    _MODE.zero_empty = True                                                    # P10
    try:
        pred = mb.build_sam3_predictor(version="sam3.1", **args)
    finally:
        _MODE.zero_empty = False
    if checkpoint_path is None:
        _init_uninitialised(pred.model, seed)                                  # P10
    _patch_init_state(pred.model)                                              # P6
    _patch_batched_grounding_off_by_one()                                      # P9
    return pred


def dtype_census(module) -> dict:
    c = collections.Counter(str(p.dtype).replace("torch.", "") for p in module.parameters())
    c.update(str(b.dtype).replace("torch.", "") for b in module.buffers())
    return dict(c)

