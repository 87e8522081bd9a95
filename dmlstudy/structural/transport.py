"""Entropic optimal transport between grids of local embeddings, and the structural similarity it defines.

The tensor algebra of DIML (Zhao, Rao, Lu, Zhou: "Towards Interpretable Deep Metric Learning with Structural
Matching", ICCV 2021, and its supplement), on embeddings only: nothing here knows a model. Two images, each
with a global embedding z̄ and N local embeddings ẑ_i (a G × G grid, N = G²), are compared by how well their
cells can be matched:

* ``S_ij = ⟨ẑ_s,i, ẑ_t,j⟩`` (cell similarities), cost ``C = 1 − S`` (Eq. 4 of the paper);
* marginals from cross-correlation ``μ_s,i ∝ ReLU(⟨ẑ_s,i, z̄_t⟩)``, ``μ_t,j ∝ ReLU(⟨ẑ_t,j, z̄_s⟩)``
  (option: uniform ``1/G²``);
* the entropic transport plan ``T = diag(a) K diag(b)``, ``K = exp(−C/ε)``, ε = 0.05, from the Sinkhorn
  iterations ``a ← μ_s / K b``, ``b ← μ_t / Kᵀ a`` (supplement Eq. A.1–A.3);
* the structural similarity ``s_struct = Σ_ij T_ij S_ij`` (Eq. 6).

Entry points: :func:`sinkhorn` (plans of a batch of problems), :func:`structural_similarity` (of given cell
similarities), :func:`pairwise_structural_similarity` (all pairs of two sets of grids: DIML's training loss,
:mod:`dmlstudy.methods.diml`) and :func:`candidate_structural_similarity` (query–candidate pairs: test-time
re-ranking, :mod:`dmlstudy.structural.reranking`).

Decisions where the paper leaves room (all stated again where they act):

* Marginals: a weight vector whose sum is not positive (every cell anti-correlated with the other
  image) falls back to uniform ``1/G²``, so both marginals always sum to 1 (a balanced problem that
  Sinkhorn can solve) and nothing divides by zero. The authors divide by ``sum + 1e-5`` instead, which
  yields an all-zero plan in that case.
* Sinkhorn runs in float32 always, autocast or not: every entry point to the transport switches autocast off
  (:func:`_without_autocast`), since under bfloat16 autocast (the default on CUDA, ``autocast: bf16`` on a CPU)
  the cell similarities and the iterations' matrix products would run in bfloat16, whose 3 significant
  digits put errors of ~0.002 into the costs, i.e. ~10 % into ``exp(−C/ε)`` at the tuned ε = 0.021. It
  runs on all pairs at once. Each pair stops on its own when the L1 violation
  of its row marginal is ≤ ``tolerance`` (the column marginal is exact after each ``b`` update) or after
  ``max_iterations``; converged pairs leave the working set, so the cost follows the typical pair, not the
  slowest one, and a pair's result does not depend on its batch. ``log_domain=None`` picks the
  log-domain iterations automatically when the kernel's dynamic range ``max C / ε`` exceeds
  :data:`LOG_DOMAIN_RANGE` (small ε), where ``exp(−C/ε)`` would underflow or the scalings overflow
  float32. On the CPU the log domain is computed by absorption (scaling iterations on a stabilised kernel,
  potentials updated only when a pair's scalings leave ``[1e-8, 1e8]``): the same iterations as log-sum-exp
  updates, up to float rounding, at about the cost of the plain ones; CUDA keeps the log-sum-exp updates.
* Query–candidate pairs (re-ranking) are solved as a chunk of queries × all their K candidates per Sinkhorn
  call, the chunk sized so its ``G² × G² × q·K`` kernel stays near 2 MB (about a core's L2 cache); the
  candidates' local embeddings are gathered one query at a time.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

DEFAULT_EPSILON = 0.05
LOG_DOMAIN_RANGE = 50.0  # auto log domain when max(C)/ε exceeds this: K would span more than e^50
SINKHORN_BLOCK_ELEMENTS = (
    2**19
)  # pairs per Sinkhorn batch: P × N × M ≤ this (2 MB kernels; 2**18 and 2**20 were no faster)
# On CUDA a batch is as large as this (128 MB kernels: the GPU has no cache to fit) and the solve never waits
# for the device but every CONVERGENCE_READ_EVERY iterations (see _sinkhorn_scalings_masked).
SINKHORN_GPU_BLOCK_ELEMENTS = 2**25
ABSORB_RANGE = 1e8  # log-domain solver on the CPU: scalings outside [1e-8, 1e8] are absorbed (see _sinkhorn_scalings)
CONVERGENCE_READ_EVERY = 8
MIN_MARGINAL_MASS = 1e-12  # weight sums at or below this fall back to uniform marginals
_TINY = torch.finfo(torch.float32).tiny


def _without_autocast(function: Callable) -> Callable:
    """``function`` with autocast off on the CPU and CUDA: its float32 tensors stay float32 inside (the inputs'
    gradients still flow back through their casts)."""

    @functools.wraps(function)
    def float32(*args, **kwargs):
        with torch.autocast("cpu", enabled=False), torch.autocast("cuda", enabled=False):
            return function(*args, **kwargs)

    return float32


@dataclass(frozen=True)
class TransportOptions:
    """Settings of the structural similarity (one object so every entry point uses the same ones).

    Args:
        epsilon: entropic regularisation ε (λ of the supplement's Eq. A.1), 0.05 in the paper.
        uniform_marginals: use ``1/G²`` marginals instead of the cross-correlation ones.
        max_iterations: Sinkhorn iterations at most (100, as the authors' code).
        tolerance: a pair stops when the L1 violation of its row marginal is at most this. 1e-3 changed
            s_struct by 7e-5 on average (at most 1e-3, the 100-iteration cap dominating) against fully
            converged plans on trained synbirds embeddings and left every top-1 re-ranking unchanged, at
            30 % fewer iterations than 1e-4.
        log_domain: True/False forces the variant; None picks log domain when ``max C / ε`` >
            :data:`LOG_DOMAIN_RANGE`.
    """

    epsilon: float = DEFAULT_EPSILON
    uniform_marginals: bool = False
    max_iterations: int = 100
    tolerance: float = 1e-3
    log_domain: bool | None = None

    def __post_init__(self) -> None:
        if not self.epsilon > 0:
            raise ValueError(f"TransportOptions.epsilon: expected a positive number, got {self.epsilon!r}")
        if self.max_iterations < 1:
            raise ValueError(f"TransportOptions.max_iterations: expected ≥ 1, got {self.max_iterations!r}")
        if self.tolerance < 0:
            raise ValueError(f"TransportOptions.tolerance: expected ≥ 0, got {self.tolerance!r}")


@dataclass
class TransportPlan:
    """A batch of transport plans ``(*, N, M)``, the Sinkhorn iterations each pair ran (``(*)``, int), and
    the largest final row-marginal violation (L1, over all pairs)."""

    plan: torch.Tensor
    pair_iterations: torch.Tensor
    marginal_error: float
    log_domain: bool

    @property
    def iterations(self) -> int:
        """Iterations of the slowest pair (the batch's wall-clock count)."""
        return int(self.pair_iterations.max()) if self.pair_iterations.numel() else 0


def _row_marginal_errors(residuals: torch.Tensor) -> torch.Tensor:
    """Per pair, the L1 violation ``Σ_i |T 1 − μ|_i`` of its row residuals (pairs last: ``N × P`` → ``P``)."""
    return residuals.abs().sum(dim=0)


def _scaling_steps(log_domain: bool):
    """``(row, update_a, update_b, row_residuals)`` of one Sinkhorn variant, on pairs-last tensors: kernel
    ``N × M × P``, ``a`` (or ``f``) ``N × P``, ``b`` (or ``g``) ``M × P``.

    Standard (supplement Eq. A.2): ``row = K b``, ``a = μ / row``, ``b = ν / Kᵀ a``, row residuals of T
    ``μ − a ⊙ row``. Log domain, on potentials ``f = log a``, ``g = log b`` (no underflow for small ε):
    ``row = log K b`` by log-sum-exp, ``f = log μ − row``, ``g = log ν − log Kᵀ a``, residuals
    ``exp(f + row) − μ``. Zero-mass cells get
    ``a = 0`` (``f = −∞``), so nothing divides by zero.

    With the pairs in the last (contiguous) dimension, ``K b`` reduces dimension −2 and ``Kᵀ a`` dimension −3
    of the same tensor, each a sum of contiguous vectors over the pairs: no transposed copy of the kernel,
    and 1.4× faster than reducing 16 × 16 matrices stored pair by pair (batched 16 × 16 matrix-vector
    products with ``bmm`` are 2–6× slower still on CPU).
    """
    if not log_domain:

        def row(kernel, b):
            return (kernel * b.unsqueeze(-3)).sum(dim=-2)  # (K b)_i = Σ_j K_ij b_j

        def update_a(source, kernel_b):
            return source / kernel_b.clamp_min(_TINY)

        def update_b(target, kernel, a):
            return target / (kernel * a.unsqueeze(-2)).sum(dim=-3).clamp_min_(_TINY)  # ν / Kᵀ a

        def row_residuals(a, kernel_b, source):
            return torch.addcmul(source, a, kernel_b, value=-1.0)  # μ − a ⊙ K b in one pass

        return row, update_a, update_b, row_residuals

    def log_row(log_kernel, g):
        return torch.logsumexp(log_kernel + g.unsqueeze(-3), dim=-2)

    def log_update_a(source, log_kernel_b):
        return torch.where(source > 0, source.clamp_min(_TINY).log() - log_kernel_b, -math.inf)

    def log_update_b(target, log_kernel, f):
        return torch.where(
            target > 0, target.clamp_min(_TINY).log() - torch.logsumexp(log_kernel + f.unsqueeze(-2), dim=-3), -math.inf
        )

    def log_row_residuals(f, log_kernel_b, source):
        return torch.exp(f + log_kernel_b) - source

    return log_row, log_update_a, log_update_b, log_row_residuals


def _first_log_step(
    log_kernel: torch.Tensor, source: torch.Tensor, target: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Potentials ``f``, ``g`` after the first Sinkhorn update from ``b = 1``, in the log domain (exact at any ε)."""
    _, update_f, update_g, _ = _scaling_steps(True)
    f = update_f(source, torch.logsumexp(log_kernel, dim=-2))
    return f, update_g(target, log_kernel, f)


def _absorbed(log_kernel: torch.Tensor, f: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """The stabilised kernel ``K̃ = exp(log K + f ⊕ g)`` of pairs-last tensors (``N × M × P``, ``N × P``,
    ``M × P``): the transport plan of the potentials f, g."""
    return (log_kernel + f.unsqueeze(1) + g.unsqueeze(0)).exp_()


def _sinkhorn_scalings(
    kernel: torch.Tensor,
    source: torch.Tensor,
    target: torch.Tensor,
    *,
    log_domain: bool,
    max_iterations: int,
    tolerance: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Scalings ``a`` (``N × P``) and ``b`` (``M × P``), or potentials, of ``P`` problems stored pairs last
    (kernel ``N × M × P``, source ``N × P``, target ``M × P``) and the iterations each one ran (``P``).

    Every pair stops on its own: when its L1 row-marginal violation is ≤ ``tolerance`` (checked before each
    update; the column marginal is exact after each ``b`` update) or after ``max_iterations`` updates. So a
    pair's result does not depend on the other pairs of the batch, exactly as a per-pair loop. Converged
    pairs are frozen, and the working set is compacted once a quarter of it has converged (cost ∝ the
    pairs still iterating).

    ``log_domain`` (``kernel`` is then ``log K``, the result the potentials ``f = log a``, ``g = log b``):
    the same iterations, computed by absorption (Schmitzer, "Stabilized sparse scaling algorithms for
    entropy regularized transport problems", SIAM J. Sci. Comput. 2019, Alg. 2) instead of a log-sum-exp
    per update. The first update runs in the log domain; then the loop iterates plain scalings ``u``, ``v``
    on ``K̃ = exp(log K + f ⊕ g)``, so that ``f + log u`` and ``g + log v`` are the log-domain potentials,
    and a pair whose scalings leave ``[1/ABSORB_RANGE, ABSORB_RANGE]`` (zero-mass cells aside) has them
    absorbed into ``f``, ``g`` and its slice of ``K̃`` recomputed. Per pair, so batching still changes
    nothing. Entries of ``K̃`` that underflow are at most ``1e-38`` of a plan entry times scalings within the
    range, below float32 resolution of the marginals.
    """
    row, update_a, update_b, row_residuals = _scaling_steps(False)
    pairs = kernel.shape[-1]
    log_kernel = f = g = None
    if log_domain:
        log_kernel = kernel
        f, g = _first_log_step(log_kernel, source, target)
        kernel = _absorbed(log_kernel, f, g)

    def finished(select):  # the result of the working set's pairs ``select``: scalings, or potentials
        if log_domain:
            return f[:, select] + a[:, select].log(), g[:, select] + b[:, select].log()
        return a[:, select], b[:, select]

    a_out, b_out = torch.ones_like(source), torch.ones_like(target)
    iterations = torch.full((pairs,), max_iterations, dtype=torch.long, device=source.device)
    ids = torch.arange(pairs, device=source.device)
    work_kernel, work_source, work_target, a, b = kernel, source, target, a_out.clone(), b_out.clone()
    active = torch.ones(pairs, dtype=torch.bool, device=source.device)
    stopped = 0  # pairs of the working set that have stopped (frozen: no longer updated)
    for step in range(1 if log_domain else 0, max_iterations):
        kernel_b = row(work_kernel, b)
        if step > 0:
            newly = _row_marginal_errors(row_residuals(a, kernel_b, work_source)) <= tolerance
            if stopped:
                newly &= active
            count = int(newly.sum())
            if count:
                iterations[ids[newly]] = step
                active ^= newly
                stopped += count
                if stopped == len(active):
                    break
                if stopped * 4 >= len(active):  # compact: drop the stopped pairs from the work
                    done = ~active
                    a_out[:, ids[done]], b_out[:, ids[done]] = finished(done)
                    keep = active.nonzero().squeeze(1)
                    n, m, width = work_kernel.shape
                    work_kernel = (
                        work_kernel.reshape(n * m, width).index_select(1, keep).view(n, m, -1)
                    )  # 2-D: ≈ 2× faster than on 3-D
                    if log_domain:
                        log_kernel = log_kernel.reshape(n * m, width).index_select(1, keep).view(n, m, -1)
                        f, g = f.index_select(-1, keep), g.index_select(-1, keep)
                    ids, work_source, work_target = (
                        ids[keep],
                        work_source.index_select(-1, keep),
                        work_target.index_select(-1, keep),
                    )
                    a, b, kernel_b = a.index_select(-1, keep), b.index_select(-1, keep), kernel_b.index_select(-1, keep)
                    active, stopped = active[keep], 0
        new_a = update_a(work_source, kernel_b)
        new_b = update_b(work_target, work_kernel, new_a)
        if stopped:
            a, b = torch.where(active, new_a, a), torch.where(active, new_b, b)
        else:
            a, b = new_a, new_b
        if log_domain:
            work_kernel = _absorb_out_of_range(log_kernel, work_kernel, f, g, a, b, work_source, work_target, active)
    a_out[:, ids], b_out[:, ids] = finished(slice(None))
    return a_out, b_out, iterations


def _absorb_out_of_range(
    log_kernel: torch.Tensor,
    kernel: torch.Tensor,
    f: torch.Tensor,
    g: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    source: torch.Tensor,
    target: torch.Tensor,
    active: torch.Tensor,
) -> torch.Tensor:
    """Absorb the scalings of the active pairs that left ``[1/ABSORB_RANGE, ABSORB_RANGE]`` (cells of zero
    mass, whose scaling is 0, aside) into the potentials, in place, and return the kernel with those pairs'
    slices recomputed."""

    def out_of_range(scaling, mass):
        return ((scaling > ABSORB_RANGE) | ((scaling < 1.0 / ABSORB_RANGE) & (mass > 0))).any(dim=0)

    absorb = (out_of_range(a, source) | out_of_range(b, target)) & active
    if not bool(absorb.any()):
        return kernel
    index = absorb.nonzero().squeeze(1)
    f[:, index] += a[:, index].log()
    g[:, index] += b[:, index].log()
    a[:, index], b[:, index] = 1.0, 1.0
    n, m, width = kernel.shape
    slices = _absorbed(log_kernel.reshape(n * m, width).index_select(1, index).view(n, m, -1), f[:, index], g[:, index])
    return kernel.reshape(n * m, width).index_copy_(1, index, slices.reshape(n * m, -1)).view(n, m, width)


def _sinkhorn_scalings_masked(
    kernel: torch.Tensor,
    source: torch.Tensor,
    target: torch.Tensor,
    *,
    log_domain: bool,
    max_iterations: int,
    tolerance: float,
    read_every: int = CONVERGENCE_READ_EVERY,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`_sinkhorn_scalings` without reading anything back from the device but every ``read_every``
    iterations: the solver CUDA uses (on a GPU the compacting solver waits for the device at every
    iteration, and a DIML run spends most of its time launching and waiting; benchmarks/README.md).

    Every pair keeps its own stopping rule: a pair whose L1 row-marginal violation is ≤ ``tolerance`` is
    frozen by ``torch.where`` at that iteration, which is recorded, exactly as the compacting solver stops
    it; the working set is never compacted (on a GPU the full width costs about what the remaining pairs
    would), and the loop ends at the first read, every ``read_every`` iterations, that finds every pair
    stopped (the extra iterations change nothing). So the scalings and iteration counts are those of
    :func:`_sinkhorn_scalings` up to float rounding (a test compares them on the CPU).
    """
    row, update_a, update_b, row_residuals = _scaling_steps(log_domain)
    fill = 0.0 if log_domain else 1.0
    a, b = torch.full_like(source, fill), torch.full_like(target, fill)
    iterations = torch.full((kernel.shape[-1],), max_iterations, dtype=torch.long, device=source.device)
    active = torch.ones(kernel.shape[-1], dtype=torch.bool, device=source.device)
    for step in range(max_iterations):
        kernel_b = row(kernel, b)
        if step > 0:
            newly = (_row_marginal_errors(row_residuals(a, kernel_b, source)) <= tolerance) & active
            iterations = torch.where(newly, step, iterations)
            active = active & ~newly
            if step % read_every == 0 and not bool(active.any()):
                break
        new_a = update_a(source, kernel_b)
        a, b = torch.where(active, new_a, a), torch.where(active, update_b(target, kernel, new_a), b)
    return a, b, iterations


def _plan(a: torch.Tensor, kernel: torch.Tensor, b: torch.Tensor, *, log_domain: bool) -> torch.Tensor:
    """``T = diag(a) K diag(b)`` of pairs-last scalings (``N × P``, ``N × M × P``, ``M × P``)."""
    if log_domain:
        return torch.exp(a.unsqueeze(-2) + kernel + b.unsqueeze(-3))
    return a.unsqueeze(-2) * kernel * b.unsqueeze(-3)


def _needs_log_domain(cost: torch.Tensor, options: TransportOptions) -> bool:
    """``options.log_domain``, or when None whether the kernel's range ``max |C| / ε`` exceeds
    :data:`LOG_DOMAIN_RANGE`."""
    if options.log_domain is not None:
        return bool(options.log_domain)
    return bool(cost.numel()) and float(cost.abs().max()) / options.epsilon > LOG_DOMAIN_RANGE


def _block_elements(device: torch.device) -> int:
    """Kernel floats per Sinkhorn batch on ``device``: a core's cache on the CPU, a large batch on CUDA."""
    return SINKHORN_GPU_BLOCK_ELEMENTS if device.type == "cuda" else SINKHORN_BLOCK_ELEMENTS


def _solver_for(device: torch.device):
    """The Sinkhorn loop for ``device``: compacting on the CPU, masked (no per-iteration read-back) on CUDA."""
    return _sinkhorn_scalings_masked if device.type == "cuda" else _sinkhorn_scalings


def _transport(
    cost: torch.Tensor, source: torch.Tensor, target: torch.Tensor, *, log_domain: bool, options: TransportOptions
) -> tuple[torch.Tensor, torch.Tensor]:
    """Plans and iterations of problems stored pairs last: cost ``N × M × *``, source ``N × *``, target
    ``M × *`` → plan ``N × M × *`` (float32) and iterations ``*``.

    Cache blocking: the pairs are solved in blocks whose kernel (≤ :data:`SINKHORN_BLOCK_ELEMENTS` floats)
    stays near a core's L2 cache across the iterations. Pairs are independent, so results do not depend on
    the blocks. On CUDA: blocks of :data:`SINKHORN_GPU_BLOCK_ELEMENTS` and :func:`_sinkhorn_scalings_masked`.
    """
    n, m, batch_shape = cost.shape[0], cost.shape[1], cost.shape[2:]
    cost = cost.reshape(n, m, -1)
    source, target = source.float().reshape(n, -1), target.float().reshape(m, -1)
    pairs = cost.shape[-1]
    plan = torch.empty(n, m, pairs, device=cost.device)
    iterations = torch.zeros(pairs, dtype=torch.long, device=cost.device)
    block = max(1, _block_elements(cost.device) // max(1, n * m))
    solve = _solver_for(cost.device)
    for start in range(0, pairs, block):
        piece = slice(start, start + block)
        kernel = torch.div(
            cost[..., piece].float(),
            -options.epsilon,
            out=torch.empty(n, m, min(block, pairs - start), device=cost.device),
        )  # log K
        if not log_domain:
            kernel.exp_()  # K = exp(−C/ε)
        a, b, iterations[piece] = solve(
            kernel,
            source[:, piece].contiguous(),
            target[:, piece].contiguous(),
            log_domain=log_domain,
            max_iterations=options.max_iterations,
            tolerance=options.tolerance,
        )
        plan[..., piece] = _plan(a, kernel, b, log_domain=log_domain)
    return plan.reshape(n, m, *batch_shape), iterations.reshape(batch_shape)


def _marginal_error(plan: torch.Tensor, source: torch.Tensor) -> float:
    """Largest L1 row-marginal violation of pairs-last plans (``N × M × *`` against ``N × *``)."""
    return float(_row_marginal_errors(plan.sum(dim=1) - source).max()) if plan.numel() else 0.0


@torch.no_grad()
@_without_autocast
def sinkhorn(
    cost: torch.Tensor,
    source_marginal: torch.Tensor,
    target_marginal: torch.Tensor,
    *,
    options: TransportOptions | None = None,
) -> TransportPlan:
    """Entropic optimal transport plans for a batch of problems (supplement Eq. A.1–A.3), in float32.

    Solves ``min_T ⟨C, T⟩ + ε Σ T (log T − 1)`` s.t. ``T 1 = μ``, ``Tᵀ 1 = ν`` for every leading index at once
    by Sinkhorn's iterations ``a ← μ / K b``, ``b ← ν / Kᵀ a``, ``K = exp(−C/ε)``, ``T = diag(a) K diag(b)``
    (no gradient: the plan is treated as a constant, as in DIML's training). Each pair stops on its own
    (see :func:`_sinkhorn_scalings`).

    Args:
        cost: ``(*, N, M)`` costs.
        source_marginal: ``(*, N)`` non-negative, each summing to 1.
        target_marginal: ``(*, M)`` non-negative, each summing to 1.
        options: ε, iterations, tolerance, log domain (see :class:`TransportOptions`).
    """
    options = options or TransportOptions()
    if (
        cost.ndim < 2
        or source_marginal.shape != cost.shape[:-1]
        or target_marginal.shape != cost.shape[:-2] + cost.shape[-1:]
    ):
        raise ValueError(
            f"sinkhorn: expected cost (*, N, M) with marginals (*, N) and (*, M), got {tuple(cost.shape)}, "
            f"{tuple(source_marginal.shape)} and {tuple(target_marginal.shape)}"
        )
    log_domain = _needs_log_domain(cost, options)
    cost, source = cost.movedim((-2, -1), (0, 1)), source_marginal.movedim(-1, 0)  # pairs last
    plan, iterations = _transport(cost, source, target_marginal.movedim(-1, 0), log_domain=log_domain, options=options)
    return TransportPlan(plan.movedim((0, 1), (-2, -1)), iterations, _marginal_error(plan, source.float()), log_domain)


def normalize_marginal(weights: torch.Tensor, *, dim: int = -1) -> torch.Tensor:
    """Non-negative weights (cells along ``dim``) → distributions summing to 1; a vector whose sum is ≤
    :data:`MIN_MARGINAL_MASS` becomes uniform ``1/N`` (never NaN, always a balanced problem)."""
    weights = weights.float().clamp_min(0.0)
    total = weights.sum(dim=dim, keepdim=True)
    uniform = torch.full_like(weights, 1.0 / weights.shape[dim])
    return torch.where(total > MIN_MARGINAL_MASS, weights / total.clamp_min(MIN_MARGINAL_MASS), uniform)


def _structural_pairs_last(
    cell_similarity: torch.Tensor,
    source_weights: torch.Tensor,
    target_weights: torch.Tensor,
    *,
    options: TransportOptions,
    log_domain: bool | None = None,
) -> tuple[torch.Tensor, TransportPlan]:
    """:func:`structural_similarity` on pairs-last tensors: S ``N × M × *``, weights ``N × *`` and ``M × *``;
    the returned plan is pairs last too. ``log_domain`` None: decided from this batch's costs."""
    if options.uniform_marginals:
        source_weights, target_weights = torch.ones_like(source_weights), torch.ones_like(target_weights)
    source = normalize_marginal(source_weights.detach(), dim=0)
    cost = torch.rsub(cell_similarity.detach().float(), 1.0)
    if log_domain is None:
        log_domain = _needs_log_domain(cost, options)
    plan, iterations = _transport(
        cost, source, normalize_marginal(target_weights.detach(), dim=0), log_domain=log_domain, options=options
    )
    similarity = (plan * cell_similarity.float()).sum(dim=(0, 1))
    return similarity, TransportPlan(plan, iterations, _marginal_error(plan, source), log_domain)


@_without_autocast
def structural_similarity(
    cell_similarity: torch.Tensor,
    source_weights: torch.Tensor,
    target_weights: torch.Tensor,
    *,
    options: TransportOptions | None = None,
) -> tuple[torch.Tensor, TransportPlan]:
    """``s_struct = Σ_ij T_ij S_ij`` for a batch of pairs (Eq. 6); gradients flow through S only.

    Args:
        cell_similarity: ``(*, N, M)`` similarities S between the cells of the two images of each pair.
        source_weights, target_weights: ``(*, N)`` / ``(*, M)`` non-negative marginal weights (normalised here).
        options: see :class:`TransportOptions`; ``uniform_marginals`` replaces the weights by ``1/N``, ``1/M``.
    """
    similarity, transport = _structural_pairs_last(
        cell_similarity.movedim((-2, -1), (0, 1)),
        source_weights.movedim(-1, 0),
        target_weights.movedim(-1, 0),
        options=options or TransportOptions(),
    )
    transport.plan = transport.plan.movedim((0, 1), (-2, -1))
    return similarity, transport


# --------------------------------------------------------------------------------------------------
# structural similarity of all pairs of two sets (training) and of query-candidate pairs (test)


@_without_autocast
def pairwise_structural_similarity(
    local_a: torch.Tensor,
    global_a: torch.Tensor,
    local_b: torch.Tensor | None = None,
    global_b: torch.Tensor | None = None,
    *,
    options: TransportOptions | None = None,
) -> tuple[torch.Tensor, torch.Tensor, TransportPlan]:
    """Structural similarity of every pair (a, b): ``A × B`` (``b`` defaults to ``a``: all pairs of a batch).

    Args:
        local_a: ``A × N × d`` L2-normalised local embeddings; global_a: ``A × d`` L2-normalised globals.
        local_b, global_b: the second set (``B × M × d``, ``B × d``), or None for the first set again.

    Returns:
        ``(s_struct A × B, cell similarities A × B × N × M, transport)``; gradients flow through S only.
    """
    local_b = local_a if local_b is None else local_b
    global_b = global_a if global_b is None else global_b
    if (
        local_a.ndim != 3
        or local_b.ndim != 3
        or global_a.shape != (local_a.shape[0], local_a.shape[2])
        or global_b.shape != (local_b.shape[0], local_b.shape[2])
    ):
        raise ValueError(
            f"pairwise_structural_similarity: expected local A × N × d with global A × d (and B × M × d with B × d), "
            f"got {tuple(local_a.shape)}, {tuple(global_a.shape)}, {tuple(local_b.shape)}, {tuple(global_b.shape)}"
        )
    local_a, local_b = local_a.float(), local_b.float()
    cell_similarity = torch.einsum("aid,bjd->ijab", local_a, local_b).contiguous()  # N × M × A × B: pairs last
    source_weights = F.relu(torch.einsum("aid,bd->iab", local_a, global_b.float()))  # ⟨ẑ_a,i, z̄_b⟩
    target_weights = F.relu(torch.einsum("bjd,ad->jab", local_b, global_a.float()))  # ⟨ẑ_b,j, z̄_a⟩
    similarity, transport = _structural_pairs_last(
        cell_similarity, source_weights, target_weights, options=options or TransportOptions()
    )
    transport.plan = transport.plan.permute(2, 3, 0, 1)
    cell_similarity = cell_similarity.permute(2, 3, 0, 1)
    return similarity, cell_similarity, transport


def _as_tensor(x: Any, *, name: str, ndim: int) -> torch.Tensor:
    tensor = x if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))
    if tensor.ndim != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D array, got shape {tuple(tensor.shape)}")
    return tensor.detach().float()


@torch.no_grad()
@_without_autocast
def candidate_structural_similarity(
    global_queries: Any,
    local_queries: Any,
    global_gallery: Any,
    local_gallery: Any,
    candidates: Any,
    *,
    options: TransportOptions | None = None,
    query_chunk: int | None = None,
    device: torch.device | str | None = None,
) -> np.ndarray:
    """``s_struct`` of every (query, candidate) pair: ``Q × K`` float32, one Sinkhorn batch per chunk of
    queries × all their K candidates (the loop is over query chunks, never over pairs).

    Each chunk is built pairs last, ready for :func:`_sinkhorn_scalings`: per query, its candidates' local
    embeddings are gathered (one query's block stays in cache) and multiplied by the query's cells and
    global embedding in one product (``(N+1) × (K·M)``, so ``⟨ẑ_c,j, z̄_q⟩`` costs no second pass over the
    gathered block); one copy per chunk then puts the pairs last. The default chunk keeps the kernel
    within :data:`SINKHORN_BLOCK_ELEMENTS` floats, so the cells, kernel, iterations and plan of a chunk
    stay near a core's L2 cache.

    ``log_domain=None`` is decided once for the whole call from a bound on the cost, ``max |C| ≤ 1 +
    max ‖ẑ_q‖ · max ‖ẑ_c‖`` (2 for L2-normalised embeddings), so every chunk runs the same variant.

    Args:
        global_queries: ``Q × d``; local_queries: ``Q × N × d``; global_gallery: ``G × d``;
            local_gallery: ``G × M × d`` (all L2-normalised; arrays or tensors).
        candidates: ``Q × K`` gallery indices.
        query_chunk: queries per Sinkhorn batch (memory ∝ query_chunk · K · N · M); None: as many as keep
            the chunk's kernel within :data:`SINKHORN_BLOCK_ELEMENTS` floats
            (:data:`SINKHORN_GPU_BLOCK_ELEMENTS` on CUDA).
        device: where to compute (default: the device of ``local_queries`` if a tensor, else CPU).
    """
    if device is None:
        device = local_queries.device if isinstance(local_queries, torch.Tensor) else torch.device("cpu")
    options = options or TransportOptions()
    gq = _as_tensor(global_queries, name="global_queries", ndim=2)
    lq = _as_tensor(local_queries, name="local_queries", ndim=3)
    gg = _as_tensor(global_gallery, name="global_gallery", ndim=2)
    lg = _as_tensor(local_gallery, name="local_gallery", ndim=3)
    index = torch.as_tensor(np.asarray(candidates), dtype=torch.long)
    if index.ndim != 2 or len(index) != len(gq) or len(lq) != len(gq) or len(lg) != len(gg):
        raise ValueError(
            f"candidate_structural_similarity: expected candidates Q × K with Q = {len(gq)} queries "
            f"(local {len(lq)}) and a gallery of {len(gg)} (local {len(lg)}), got candidates {tuple(index.shape)}"
        )
    if index.numel() and (index.min() < 0 or index.max() >= len(gg)):
        raise ValueError(
            f"candidates: expected gallery indices in [0, {len(gg)}), got [{int(index.min())}, {int(index.max())}]"
        )
    gq, lq, gg, lg, index = gq.to(device), lq.to(device), gg.to(device), lg.to(device), index.to(device)
    out = torch.empty(index.shape, dtype=torch.float32)
    if not index.numel():
        return out.numpy()
    n_cells, m_cells, dim = lq.shape[1], lg.shape[1], lg.shape[2]
    top = index.shape[1]
    if query_chunk is None:
        query_chunk = _block_elements(lq.device) // max(1, top * n_cells * m_cells)
    query_chunk = max(1, int(query_chunk))
    log_domain = options.log_domain
    if log_domain is None:
        bound = 1.0 + float(lq.norm(dim=-1).max()) * float(lg.norm(dim=-1).max())
        log_domain = bound / options.epsilon > LOG_DOMAIN_RANGE
    flat_local = lg.reshape(len(lg), m_cells * dim)
    query_rows = torch.cat([lq, gq[:, None]], dim=1)  # Q × (N+1) × d: the global as an extra row
    gathered = torch.empty(top, m_cells * dim, device=device)
    products = torch.empty(query_chunk, n_cells + 1, top * m_cells, device=device)
    for start in range(0, len(gq), query_chunk):
        stop = min(start + query_chunk, len(gq))
        pairs = (stop - start) * top
        for slot, query in enumerate(range(start, stop)):
            local_c = torch.index_select(flat_local, 0, index[query], out=gathered).view(top * m_cells, dim)
            torch.mm(query_rows[query], local_c.T, out=products[slot])  # (N+1) × (K·M)
        by_cell = (
            products[: stop - start].view(stop - start, n_cells + 1, top, m_cells).permute(1, 3, 0, 2)
        )  # (N+1) × M × q × K
        cells = by_cell[:n_cells].reshape(n_cells, m_cells, pairs)  # pairs last: pair (q, k) at q·K + k
        target_weights = by_cell[n_cells].reshape(m_cells, pairs)  # ⟨ẑ_c,j, z̄_q⟩
        global_c = gg.index_select(0, index[start:stop].reshape(-1)).view(stop - start, top, dim)
        source_weights = (
            torch.bmm(lq[start:stop], global_c.transpose(1, 2)).transpose(0, 1).reshape(n_cells, pairs)
        )  # ⟨ẑ_q,i, z̄_c⟩
        similarity, _ = _structural_pairs_last(
            cells, source_weights, target_weights, options=options, log_domain=bool(log_domain)
        )
        out[start:stop] = similarity.view(stop - start, top).cpu()
    return out.numpy()
