"""The fuzzer's raw material (tests/ops/_fuzz.py): a `Case` (one op call), `Draw` (hypothesis
draws plus a seeded random.Random), valid values, and the mutations a valid case gets: a layout
the kernels cannot read, a hostile scalar or a wrong length."""

from __future__ import annotations

import random
from fractions import Fraction

import torch
from hypothesis import strategies as st

I64_MAX, I64_MIN = 2**63 - 1, -(2**63)
HOSTILE_INTS = (I64_MAX, I64_MIN, -1, -100, 2**31, 2**32 + 1, 2**40, 2**62)
HOSTILE_REALS = (
    0, 0.0, -1.0, float("nan"), float("inf"), float("-inf"), 1e-45, 1e-39, 1e-7, 1e39, 10**400,
    True, "1.0", None, Fraction(10**500, 3),
)  # fmt: skip


class Case:
    """One op call: its keyword arguments and the mutation applied (None: a valid input)."""

    def __init__(self, args: dict, mutation: str | None = None):
        self.args = args
        self.mutation = mutation

    def describe(self) -> str:
        lines = [f"mutation: {self.mutation}"]
        for name, value in self.args.items():
            lines.append(f"  {name} = {_describe(value)}")
        return "\n".join(lines)


def _describe(value) -> str:
    if not isinstance(value, torch.Tensor):
        return repr(value)[:200]
    flags = [f for f in ("is_neg", "is_conj", "_is_zerotensor") if getattr(value, f)()]
    head = f"Tensor{tuple(value.shape)} {value.dtype} {value.device} {value.layout} strides=" + (
        str(value.stride()) if value.layout == torch.strided else "-"
    )
    try:
        shown = value.reshape(-1)[:24].tolist() if value.layout == torch.strided else "sparse"
    except Exception as error:  # freed storage, meta, ZeroTensor: the description must not die
        shown = f"<unreadable: {type(error).__name__}>"
    return f"{head} {' '.join(flags)} {shown}"


class Draw:
    """Hypothesis draws for sizes and small ints (its bias to 0, 1 and the bounds is what finds
    edge cases), and a random.Random seeded by hypothesis for categorical picks: hypothesis'
    own sampled_from, derandomized, keeps to the first few options, and the mutations must all
    get their turn."""

    def __init__(self, data):
        self.data = data
        self.rng = random.Random(data.draw(st.integers(0, 2**64 - 1)))

    def int(self, low: int, high: int) -> int:
        return self.data.draw(st.integers(low, high))

    def bool(self, p_true: float = 0.5) -> bool:
        return self.rng.random() < p_true

    def choice(self, options):
        return self.rng.choice(list(options))

    def generator(self):
        return torch.Generator().manual_seed(self.rng.getrandbits(63))


# ---- valid values ------------------------------------------------------------------------------


def random_floats(draw: Draw, shape, dtype, scales, special: bool = True):
    """Normal values times a drawn scale, in `dtype`, sometimes with NaN and +-inf sprinkled in."""
    generator = draw.generator()
    scale = draw.choice(scales)
    values = torch.randn(shape, generator=generator, dtype=torch.float64) * scale
    limit = torch.finfo(dtype).max
    values = values.clamp(-limit, limit).to(dtype)  # finite unless NaN/inf are sprinkled in below
    if special and values.numel() and draw.bool(0.2):
        flat = values.view(-1)
        for _ in range(draw.int(1, 3)):
            flat[draw.int(0, flat.numel() - 1)] = draw.choice([float("nan"), float("inf"), float("-inf")])
    return values


def random_ints(draw: Draw, shape, low: int, high: int):
    """Uniform ints in [low, high) (high - low may be up to 2^63)."""
    if high <= low:
        return torch.full(shape, low, dtype=torch.int64)
    generator = draw.generator()
    span = high - low
    if span < 2**62:
        return torch.randint(low, high, shape, generator=generator, dtype=torch.int64)
    # Too wide for randint: the first 2^62 values of the range (still spanning every magnitude).
    return low + torch.randint(0, 2**62, shape, generator=generator, dtype=torch.int64)


def random_mask(draw: Draw, n: int):
    kind = draw.choice(["random", "all", "none"])
    if kind == "all":
        return torch.ones(n, dtype=torch.bool)
    if kind == "none":
        return torch.zeros(n, dtype=torch.bool)
    return torch.rand(n, generator=draw.generator()) < 0.6


def pack(lengths):
    """cu offsets for sequences of these lengths."""
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return torch.tensor(cu, dtype=torch.int64)


def at_offset(draw: Draw, x):
    """x in a contiguous tensor that starts inside a larger storage (valid: data_ptr moves)."""
    pad = draw.int(1, 5)
    buffer = torch.zeros(pad + x.numel(), dtype=x.dtype, device=x.device)
    buffer[pad:] = x.reshape(-1)
    return buffer[pad:].view(x.shape)


# ---- mutations -----------------------------------------------------------------------------------

LAYOUTS = ("strided", "transposed", "expanded", "neg", "conj", "zero", "freed", "sparse", "meta", "list",
           "dtype", "rank", "bool bytes")  # fmt: skip


def relayout(draw: Draw, x, kind: str):
    """x's values (for 'expanded', its first value) in another form: mostly ones the kernels
    cannot read as they are; 'bool bytes' (True stored as 2) is valid, if odd."""
    if kind == "strided":  # every other element of a larger buffer
        if x.dim() == 1:
            buffer = torch.zeros(2 * x.shape[0] + 1, dtype=x.dtype, device=x.device)
            buffer[::2][: x.shape[0]] = x
            return buffer[: 2 * x.shape[0] : 2]
        buffer = torch.zeros(x.shape[0], 2 * x.shape[1], dtype=x.dtype, device=x.device)
        buffer[:, ::2] = x
        return buffer[:, ::2]
    if kind == "transposed" and x.dim() == 2:
        return x.T.contiguous().T
    if kind == "expanded" and x.numel() > 0:
        return x.reshape(-1)[:1].reshape([1] * x.dim()).expand(x.shape)
    if kind == "neg" and x.dtype != torch.bool:
        return torch._neg_view(-x)  # means x, stores -x
    if kind == "conj":
        return x.to(torch.complex64).conj()
    if kind == "zero":
        return torch._efficientzerotensor(x.shape, dtype=x.dtype, device=x.device)
    if kind == "freed" and x.numel() > 0:
        y = x.clone()
        y.untyped_storage().resize_(0)
        return y
    if kind == "sparse":
        return x.to_sparse()
    if kind == "meta":
        return x.to("meta")
    if kind == "list":
        return x.tolist()
    if kind == "dtype":
        others = [d for d in (torch.float64, torch.float16, torch.int32, torch.int64, torch.bool, torch.uint8)
                  if d != x.dtype]  # fmt: skip
        return x.to(draw.choice(others))
    if kind == "bool bytes" and x.dtype == torch.bool:
        return (x.to(torch.uint8) * 2).view(torch.bool)
    if kind == "rank":
        return x.unsqueeze(0) if x.dim() == 1 else x.reshape(-1)
    return x.clone()  # the layout does not apply to this tensor: an ordinary valid one


def mutate(draw: Draw, case: Case, value_mutations: dict, device) -> Case:
    """Place the valid case on the device, applying at most one mutation: one of the op's own
    value mutations (name -> function(case), applied before placing), a layout one on a random
    tensor argument, a hostile scalar, or a wrong length."""
    # 30% valid, 25% an op-specific value, 25% a layout, 12% a hostile scalar, 8% a wrong length.
    which = draw.rng.randrange(100)
    if 30 <= which < 55 and value_mutations:
        name = draw.choice(sorted(value_mutations))
        value_mutations[name](case)
        case.mutation = name
    place_valid(draw, case, device)
    if which < 55:
        return case
    tensors = [n for n, v in case.args.items() if isinstance(v, torch.Tensor)]
    scalars = [n for n, v in case.args.items() if not isinstance(v, torch.Tensor)]
    with torch.no_grad():
        if which < 80 and tensors:
            name = draw.choice(tensors)
            kind = draw.choice(LAYOUTS)
            case.args[name] = relayout(draw, case.args[name], kind)
            case.mutation = f"{kind} {name}"
        elif which < 92 and scalars:
            name = draw.choice(scalars)
            case.args[name] = draw.choice(HOSTILE_REALS + HOSTILE_INTS + (2.5, 2**64))
            case.mutation = f"hostile {name}"
        elif tensors:
            name = draw.choice(tensors)
            x = case.args[name]
            if x.dim() == 1:
                extra = torch.zeros(1, dtype=x.dtype, device=x.device)
                case.args[name] = x[1:].clone() if x.shape[0] and draw.bool() else torch.cat([x, extra])
            else:
                case.args[name] = x[:, 1:].clone() if draw.bool() else x[1:].clone()
            case.mutation = f"length {name}"
    return case


def place_valid(draw: Draw, case: Case, device) -> Case:
    """Move every tensor to the device; some at a storage offset or requiring grad (both valid)."""
    for name, value in case.args.items():
        if isinstance(value, torch.Tensor):
            value = value.to(device)
            if value.numel() and draw.bool(0.25):
                value = at_offset(draw, value)
            if value.is_floating_point() and draw.bool(0.1):
                value = value.detach().requires_grad_()
            case.args[name] = value
    return case
