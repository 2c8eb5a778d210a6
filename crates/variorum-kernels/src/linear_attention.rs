//! Causal kernelised ("linear") attention as one CPU kernel, forward and backward, on the flex
//! backend. With a feature map φ and an optional decay g_t = exp(a_t) per key:
//!
//! S_t = g_t S_{t−1} + φ(k_t) [v_t; 1]ᵀ,   [n_t; d_t] = φ(q_t)ᵀ S_t,   o_t = n_t / max(d_t, ε),
//!
//! the kernelised core of `variorum_attention`'s `kernelised/kernel.rs` (linear, Performer, RFA, with or without
//! the gate; RFA-Gate's key weight 1 − g_t is applied here too, [`LinearSpec::gated_keys`]). Composed from Burn's
//! ops, the chunked form keeps every chunk's carried sums S `[features, d_v + 1]` for the backward
//! (and, gated, records one op per chunk), and autodiff keeps φ(q), φ(k) and the maps'
//! intermediates, `[L, features]` each. Here each (batch, head) is one task that walks its chunks
//! of C positions with one S: it applies φ to the chunk's rows ([`FeatureMap`]: the features
//! themselves, elu + 1, or Performer's random features from q and k), forms the C × C products
//! inside the chunk and carries S across. Only the output and the normaliser d_t per position are
//! saved; φ is never stored.
//!
//! The backward recomputes φ and the sums: a forward sweep rebuilds S before each chunk for dq, a
//! reverse sweep carries R = Σ_{i later} (decay) φ(q_i) [dn_i; dd_i]ᵀ for dk and dv:
//!
//! dφ(q_i) = Σ_{j ≤ i} c_ij (du_i·[v_j; 1]) φ(k_j),   dφ(k_j) = Σ_{i ≥ j} c_ij (du_i·[v_j; 1]) φ(q_i),
//! dv_j = Σ_{i ≥ j} c_ij (φ(q_i)·φ(k_j)) dn_i,   c_ij = Π_{j < r ≤ i} g_r,
//!
//! with du_i = [dn_i; dd_i] = [dO_i / D_i; −dO_i·o_i / D_i] (dd_i = 0 where the clamp holds), then
//! through φ to q and k. The decay's gradient needs no per-position state: a_r scales exactly the
//! pairs j < r ≤ i, so da_r = Σ_{i ≥ r} φ(q_i)·dφ(q_i) − Σ_{j ≥ r} φ(k_j)·dφ(k_j) (the pairs with
//! i ≥ r, less those with j ≥ r), a suffix sum.
//!
//! Memory is the inputs, the output and their gradients, with one S, one R, a few chunks of
//! scratch and a few values per position (the decays) per running task; time
//! O(L·C·(m + d_v) + L·m·d_v) for m features. Tasks are the (batch, head) pairs, each with
//! single-threaded GEMMs: a call with one of them runs on one core. [`causal_linear_attention`]
//! returns `None` off flex, and the caller composes Burn's ops.

use burn::prelude::*;

/// The feature map φ the kernel applies to the rows of q and k. The projected maps take a
/// projection W `[h_w, r, d]` — r rows per head, h_w = 1 (shared) or one per head — and return its
/// gradient where it is tracked.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FeatureMap {
    /// q and k are the features already (`[b, h, L, m]`).
    Given,
    /// φ(x) = elu(x) + 1 (Katharopoulos et al. 2020).
    EluPlusOne,
    /// FAVOR+'s positive random features of exp(q·k) (Choromanski et al. 2021) on s·x, m = r:
    /// φ(x) = exp(s w_r·x − s²‖x‖²/2 − c)/√m. For a query c is its largest exponent (it cancels in
    /// the ratio); for key j it is the running maximum M_j of the keys' largest exponents so far,
    /// and the sums decay by exp(M_{j−1} − M_j) as M grows — the kernel's own decay, so no
    /// `log_gate` is given. Outputs then depend on earlier keys only, in their rounding too. (The
    /// decay has no floor here; the composed path floors it at 10⁻³⁰, which differs only where M
    /// jumps by more than 69 nats, leaving 10⁻³⁰ of the earlier sums against e^{−jump}.)
    Positive {
        /// s, the scale applied to x before the projection (Performer: d^{−1/4}).
        scale: f32,
    },
    /// φ(x) = ReLU(s w_r·x)/√m + 10⁻³ (Performer's ReLU kernel), m = r.
    Relu {
        /// s, the scale applied to x before the projection (Performer: d^{−1/4}).
        scale: f32,
    },
    /// Random Fourier features of the unit vector (RFA, Peng et al. 2021), m = 2r:
    /// φ(x) = [sin(W x̂); cos(W x̂)]/√r, x̂ = x / max(‖x‖, 10⁻⁶).
    Fourier,
}

impl FeatureMap {
    /// Whether the map takes a projection W.
    pub fn projected(self) -> bool {
        !matches!(self, Self::Given | Self::EluPlusOne)
    }
}

/// Chunk, normaliser floor, feature map and key weighting of one call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinearSpec {
    /// Positions per chunk (at least 1).
    pub chunk: usize,
    /// ε, the floor of the normaliser d_t.
    pub min_normaliser: f32,
    /// φ, applied to the rows of q and k.
    pub features: FeatureMap,
    /// Each key joins the sums with weight 1 − g_t (RFA-Gate's S_t = g_t S_{t−1} + (1 − g_t)
    /// φ(k_t) v_tᵀ); needs a decay. False: weight 1.
    pub gated_keys: bool,
}

impl LinearSpec {
    /// `chunk` and ε with `features`, keys of weight 1.
    pub fn new(chunk: usize, min_normaliser: f32, features: FeatureMap) -> Self {
        Self { chunk, min_normaliser, features, gated_keys: false }
    }
}

thread_local! {
    static CALLS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    static PACKED_CALLS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// How many forwards of this kernel this thread has run (tests check a kind took it).
pub fn calls() -> usize {
    CALLS.get()
}

/// How many of them read a packed projection ([`causal_linear_self_attention`]).
pub fn packed_calls() -> usize {
    PACKED_CALLS.get()
}

/// The causal kernelised attention of `q: [b, h, L, d]`, `k: [b, h, L, d]` over values
/// `v: [b, h, L, d_v]` through `spec.features` (with its `projection` `[h_w, r, d]` where it has
/// one), each key decaying the sums before it by exp(`log_gate`) `[b, h, L]` when one is given
/// (log g ≤ 0: a decay, never a growth; the kernel's exponentials assume it):
/// `[b, L, h · d_v]`, normalised, heads merged (ready for the output projection). `None` on a
/// backend or float type without the kernel.
pub fn causal_linear_attention(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    log_gate: Option<Tensor<3>>,
    projection: Option<Tensor<3>>,
    spec: LinearSpec,
) -> Option<Tensor<3>> {
    #[cfg(feature = "flex")]
    if crate::has_kernel(&q)
        && crate::has_kernel(&k)
        && crate::has_kernel(&v)
        && extras_have_kernel(&log_gate, &projection)
    {
        let [b, h, l, d] = q.dims();
        assert_eq!(k.dims(), [b, h, l, d], "keys {:?} do not fit queries {:?}", k.dims(), q.dims());
        assert_eq!(&v.dims()[..3], &[b, h, l], "values {:?} do not fit queries {:?}", v.dims(), q.dims());
        let form = Form::of(spec, [b, h, l, d], &log_gate, &projection, None);
        let [a, w] = dummies(log_gate, projection, &q.device());
        CALLS.set(CALLS.get() + 1);
        let (q, k, v) = (q.into_dispatch(), k.into_dispatch(), v.into_dispatch());
        let out = burn::backend::Dispatch::causal_linear(q, k, v, a, w, form);
        return Some(Tensor::from_dispatch(out));
    }
    let _ = (q, k, v, log_gate, projection, spec);
    None
}

/// [`causal_linear_attention`] of self-attention straight from a fused projection's output
/// `qkv: [b, L, 3 h · d]` (queries, keys, values side by side, `n_heads` each): no head split is
/// recorded, and the gradient comes back in the projection's layout. `[b, L, h · d]`.
pub fn causal_linear_self_attention(
    qkv: Tensor<3>,
    n_heads: usize,
    log_gate: Option<Tensor<3>>,
    projection: Option<Tensor<3>>,
    spec: LinearSpec,
) -> Option<Tensor<3>> {
    #[cfg(feature = "flex")]
    if crate::has_kernel(&qkv) && extras_have_kernel(&log_gate, &projection) {
        let [b, l, width] = qkv.dims();
        assert!(n_heads > 0 && width % (3 * n_heads) == 0, "{width} is not three times {n_heads} heads");
        let d = width / (3 * n_heads);
        let form = Form::of(spec, [b, n_heads, l, d], &log_gate, &projection, Some(n_heads));
        let [a, w] = dummies(log_gate, projection, &qkv.device());
        CALLS.set(CALLS.get() + 1);
        PACKED_CALLS.set(PACKED_CALLS.get() + 1);
        let out = burn::backend::Dispatch::causal_linear_packed(qkv.into_dispatch(), a, w, form);
        return Some(Tensor::from_dispatch(out));
    }
    let _ = (qkv, n_heads, log_gate, projection, spec);
    None
}

/// What a call hands the kernel besides its tensors.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Form {
    spec: LinearSpec,
    /// Whether the decay and the projection are real (a one-element stand-in otherwise).
    gate: bool,
    projection: bool,
    /// The heads of a packed projection; `None`: q, k and v apart.
    packed: Option<usize>,
}

impl Form {
    #[cfg(feature = "flex")]
    fn of(
        spec: LinearSpec,
        [b, h, l, d]: [usize; 4],
        log_gate: &Option<Tensor<3>>,
        projection: &Option<Tensor<3>>,
        packed: Option<usize>,
    ) -> Self {
        assert!(spec.chunk >= 1, "a chunk of at least one position");
        assert_eq!(projection.is_some(), spec.features.projected(), "{:?} and a projection", spec.features);
        let positive = matches!(spec.features, FeatureMap::Positive { .. });
        assert!(!(positive && log_gate.is_some()), "positive features decay by their own running maximum");
        assert!(!spec.gated_keys || log_gate.is_some(), "gated keys need a decay");
        if let Some(a) = log_gate {
            assert_eq!(a.dims(), [b, h, l], "one log-decay per key");
        }
        if let Some(w) = projection {
            let [hw, _, dw] = w.dims();
            assert!(dw == d && (hw == 1 || hw == h), "the projection {:?} is [1 or heads, rows, d_h]", w.dims());
        }
        Self { spec, gate: log_gate.is_some(), projection: projection.is_some(), packed }
    }
}

#[cfg(feature = "flex")]
fn extras_have_kernel(log_gate: &Option<Tensor<3>>, projection: &Option<Tensor<3>>) -> bool {
    log_gate.as_ref().is_none_or(crate::has_kernel) && projection.as_ref().is_none_or(crate::has_kernel)
}

/// The decay and the projection as dispatch tensors, a one-element stand-in for each one absent.
#[cfg(feature = "flex")]
fn dummies(
    log_gate: Option<Tensor<3>>,
    projection: Option<Tensor<3>>,
    device: &Device,
) -> [burn::backend::DispatchTensor; 2] {
    let stand_in = || Tensor::<1>::zeros([1], device).into_dispatch();
    [log_gate.map_or_else(stand_in, |a| a.into_dispatch()), projection.map_or_else(stand_in, |w| w.into_dispatch())]
}

#[cfg(feature = "flex")]
pub use flex::*;

#[cfg(feature = "flex")]
mod flex {
    use super::*;

    use crate::causal_attention::flex::{Dest, Heads, Shared, gemm, packed_views, readable, readable_packed};
    use crate::fast_math;
    use burn::backend::autodiff::NodeId;
    use burn::backend::autodiff::checkpoint::base::Checkpointer;
    use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
    use burn::backend::autodiff::grads::Gradients;
    use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
    use burn::backend::flex::FlexTensor;
    use burn::backend::tensor::FloatTensor;
    use burn::backend::{Autodiff, Backend, Flex, backend_extension};
    use rayon::prelude::*;

    /// ReLU features' floor (Performer's code adds it so that φ(q)·z never vanishes).
    const RELU_FLOOR: f32 = 1e-3;
    /// The floor of ‖x‖ in Fourier features' x̂ = x / ‖x‖.
    const MIN_NORM: f32 = 1e-6;

    /// Causal kernelised attention of the backends that have a kernel for it.
    #[backend_extension(Flex, Autodiff)]
    pub trait LinearAttention: Backend {
        /// [`causal_linear_attention`]: q, k, v `[b, h, L, d]`, the decay and the projection (or
        /// one-element stand-ins, as `form` says) → `[b, L, h · d_v]`.
        fn causal_linear(
            q: FloatTensor<Self>,
            k: FloatTensor<Self>,
            v: FloatTensor<Self>,
            log_gate: FloatTensor<Self>,
            projection: FloatTensor<Self>,
            form: Form,
        ) -> FloatTensor<Self>;

        /// [`causal_linear_self_attention`]: a packed projection `[b, L, 3 h d]`.
        fn causal_linear_packed(
            qkv: FloatTensor<Self>,
            log_gate: FloatTensor<Self>,
            projection: FloatTensor<Self>,
            form: Form,
        ) -> FloatTensor<Self>;
    }

    /// One call's views and sizes.
    struct Call<'a> {
        q: Heads<'a>,
        k: Heads<'a>,
        v: Heads<'a>,
        /// a_t per (batch·head, position), contiguous, when given.
        gate: Option<&'a [f32]>,
        /// W `[h_w, r, d]`, contiguous, for the projected maps.
        w: Option<&'a [f32]>,
        hw: usize,
        r: usize,
        len: usize,
        /// Input width d and feature count m.
        d: usize,
        m: usize,
        dv: usize,
        spec: LinearSpec,
    }

    /// A task's per-chunk scratch, sized for a full chunk.
    struct Scratch {
        /// φ of the chunk's queries and keys (keys weighted), and their gradients, `[C, m]` each.
        fq: Vec<f32>,
        fk: Vec<f32>,
        dfq: Vec<f32>,
        dfk: Vec<f32>,
        /// The keys' φ before their weights, `[C, m]` (gated keys only).
        fraw: Vec<f32>,
        /// The C × C block.
        a: Vec<f32>,
        /// G_i, the cumulative log-decay inside the chunk.
        g: Vec<f32>,
        /// `[C, max(m, d_v + 1, d)]`.
        t: Vec<f32>,
    }

    impl<'a> Call<'a> {
        fn of(
            [q, k, v]: [Heads<'a>; 3],
            gate: Option<&'a FlexTensor>,
            w: Option<&'a FlexTensor>,
            spec: LinearSpec,
        ) -> Self {
            let [_, _, len, d] = q.dims;
            let (hw, r) = w.map_or((1, d), |w| (w.layout().shape()[0], w.layout().shape()[1]));
            let m = if spec.features == FeatureMap::Fourier { 2 * r } else { r };
            let dv = v.dims[3];
            let (gate, w) = (gate.map(|g| g.storage::<f32>()), w.map(|w| w.storage::<f32>()));
            Self { q, k, v, gate, w, hw, r, len, d, m, dv, spec }
        }

        fn tasks(&self) -> usize {
            self.q.dims[0] * self.q.dims[1]
        }

        /// Row stride of the output `[b, L, h · d_v]` (heads merged) and its gradient.
        fn out_rs(&self) -> usize {
            self.q.dims[1] * self.dv
        }

        /// Where row `t` of `task`'s head starts in the output.
        fn out_at(&self, task: usize, t: usize) -> usize {
            let h = self.q.dims[1];
            ((task / h) * self.len + t) * self.out_rs() + (task % h) * self.dv
        }

        fn cmax(&self) -> usize {
            self.spec.chunk.min(self.len.max(1))
        }

        fn scratch(&self) -> Scratch {
            let (c, m) = (self.cmax(), self.m);
            Scratch {
                fq: vec![0.0; c * m],
                fk: vec![0.0; c * m],
                dfq: vec![0.0; c * m],
                dfk: vec![0.0; c * m],
                fraw: vec![0.0; if self.spec.gated_keys { c * m } else { 0 }],
                a: vec![0.0; c * c],
                g: vec![0.0; c],
                t: vec![0.0; c * m.max(self.dv + 1).max(self.d)],
            }
        }

        /// Row `i` of head `task` of `x` (q, k or v).
        fn row(x: &Heads, task: usize, i: usize) -> *const f32 {
            let h = x.dims[1];
            x.head(task / h, task % h).wrapping_offset(i as isize * x.rs())
        }

        /// Which of W's heads serves `task`.
        fn w_head(&self, task: usize) -> usize {
            if self.hw == 1 { 0 } else { task % self.q.dims[1] }
        }

        /// W `[r, d]` of `task`'s head.
        fn w(&self, task: usize) -> &[f32] {
            let (r, d) = (self.r, self.d);
            let w = self.w.expect("a projected map has W");
            &w[self.w_head(task) * r * d..(self.w_head(task) + 1) * r * d]
        }

        /// The chunks of one head: (first position, positions).
        fn chunks(&self) -> impl DoubleEndedIterator<Item = (usize, usize)> + '_ {
            let c = self.spec.chunk;
            (0..self.len.div_ceil(c)).map(move |i| (i * c, c.min(self.len - i * c)))
        }

        /// The task's log-decays a_t `[L]` (given, or from the running maximum of positive
        /// features) and, for positive features, each key's scale M_t; `None` without a decay.
        fn decays(&self, task: usize, s: &mut Scratch) -> (Option<Vec<f32>>, Vec<f32>) {
            if let Some(a) = self.gate {
                let a = &a[task * self.len..(task + 1) * self.len];
                debug_assert!(a.iter().all(|&x| x <= 0.0), "a log-decay above 0");
                return (Some(a.to_vec()), Vec::new());
            }
            if !matches!(self.spec.features, FeatureMap::Positive { .. }) {
                return (None, Vec::new());
            }
            let (mut scale, mut a) = (Vec::with_capacity(self.len), Vec::with_capacity(self.len));
            let mut running = f32::NEG_INFINITY;
            for (t0, n) in self.chunks() {
                // SAFETY: rows t0..t0 + n of this head's keys, into a chunk of scratch
                unsafe { self.project(&self.k, task, t0, n, &mut s.fk) };
                for row in s.fk[..n * self.m].chunks_exact(self.m) {
                    let own = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let before = if running == f32::NEG_INFINITY { own } else { running };
                    running = before.max(own);
                    a.push(before - running);
                    scale.push(running);
                }
            }
            (Some(a), scale)
        }

        /// The projected maps' pre-activations of rows t0..t0 + n of `x` into the first r columns
        /// of `out` (row stride m): s·W x − s²‖x‖²/2 (positive), s·W x (ReLU), W x̂ (Fourier).
        unsafe fn project(&self, x: &Heads, task: usize, t0: usize, n: usize, out: &mut [f32]) {
            let (m, r, d) = (self.m, self.r, self.d);
            let s = match self.spec.features {
                FeatureMap::Positive { scale } | FeatureMap::Relu { scale } => scale,
                _ => 1.0,
            };
            let xp = Self::row(x, task, t0);
            let w = self.w(task);
            // SAFETY: the caller's rows; Wᵀ as (d × r): element (e, j) is w[j·d + e]
            unsafe {
                gemm(
                    (n, r, d),
                    out.as_mut_ptr(),
                    m as isize,
                    false,
                    xp,
                    (x.rs(), x.cs()),
                    w.as_ptr(),
                    (1, d as isize),
                    s,
                )
            };
            match self.spec.features {
                FeatureMap::Positive { .. } => {
                    for (i, row) in out[..n * m].chunks_exact_mut(m).enumerate() {
                        let half = 0.5 * s * s * self.input_row(x, xp, i).map(|v| v * v).sum::<f32>();
                        row.iter_mut().for_each(|e| *e -= half);
                    }
                }
                FeatureMap::Fourier => {
                    for (i, row) in out[..n * m].chunks_exact_mut(m).enumerate() {
                        let inv = 1.0 / self.norm(x, xp, i).max(MIN_NORM);
                        row[..r].iter_mut().for_each(|e| *e *= inv);
                    }
                }
                _ => {}
            }
        }

        /// The d inputs of row `i` after `xp`.
        fn input_row(&self, x: &Heads, xp: *const f32, i: usize) -> impl Iterator<Item = f32> {
            let (rs, cs) = (x.rs(), x.cs());
            // SAFETY: row i of the caller's rows holds d elements at stride cs
            (0..self.d).map(move |e| unsafe { *xp.offset(i as isize * rs + e as isize * cs) })
        }

        /// ‖x_i‖ of row `i` after `xp`.
        fn norm(&self, x: &Heads, xp: *const f32, i: usize) -> f32 {
            self.input_row(x, xp, i).map(|v| v * v).sum::<f32>().sqrt()
        }

        /// φ of rows t0..t0 + n of `x` into `out` `[n, m]`; `scale` holds each key's M_t
        /// (positive features of keys), empty for queries.
        unsafe fn features(&self, x: &Heads, task: usize, t0: usize, n: usize, scale: &[f32], out: &mut [f32]) {
            let (m, r, xp) = (self.m, self.r, Self::row(x, task, t0));
            let inv_sqrt = 1.0 / (r as f32).sqrt();
            match self.spec.features {
                FeatureMap::Given | FeatureMap::EluPlusOne => {
                    let elu = self.spec.features == FeatureMap::EluPlusOne;
                    for (i, row) in out[..n * m].chunks_exact_mut(m).enumerate() {
                        for (o, xv) in row.iter_mut().zip(self.input_row(x, xp, i)) {
                            *o = if !elu {
                                xv
                            } else if xv > 0.0 {
                                xv + 1.0
                            } else {
                                xv.exp()
                            };
                        }
                    }
                }
                FeatureMap::Positive { .. } => {
                    // SAFETY: as the caller's
                    unsafe { self.project(x, task, t0, n, out) };
                    for (i, row) in out[..n * m].chunks_exact_mut(m).enumerate() {
                        let c = if scale.is_empty() {
                            row.iter().copied().fold(f32::NEG_INFINITY, f32::max)
                        } else {
                            scale[t0 + i]
                        };
                        exp_below(row, c, inv_sqrt);
                    }
                }
                FeatureMap::Relu { .. } => {
                    // SAFETY: as the caller's
                    unsafe { self.project(x, task, t0, n, out) };
                    out[..n * m].iter_mut().for_each(|e| *e = e.max(0.0) * inv_sqrt + RELU_FLOOR);
                }
                FeatureMap::Fourier => {
                    // SAFETY: as the caller's
                    unsafe { self.project(x, task, t0, n, out) };
                    for row in out[..n * m].chunks_exact_mut(m) {
                        let (sin, cos) = row.split_at_mut(r);
                        for (s, c) in sin.iter_mut().zip(cos) {
                            let (sv, cv) = s.sin_cos();
                            (*s, *c) = (sv * inv_sqrt, cv * inv_sqrt);
                        }
                    }
                }
            }
        }

        /// Multiplies the keys' rows of `fk` by their weights 1 − e^{a_t}, keeping the unweighted
        /// rows in `fraw`.
        fn weigh(&self, gate: &[f32], t0: usize, n: usize, fk: &mut [f32], fraw: &mut [f32]) {
            let m = self.m;
            fraw[..n * m].copy_from_slice(&fk[..n * m]);
            for (i, row) in fk[..n * m].chunks_exact_mut(m).enumerate() {
                let w = 1.0 - gate[t0 + i].exp();
                row.iter_mut().for_each(|x| *x *= w);
            }
        }

        /// The gradient of rows t0..t0 + n of `x` from dφ (`dphi`, overwritten) and φ (`phi`),
        /// into `dst` (row stride d); W's into `dw` `[r, d]` (accumulated) when it is wanted.
        /// `t` is scratch.
        #[allow(clippy::too_many_arguments)]
        unsafe fn emit(
            &self,
            x: &Heads,
            task: usize,
            (t0, n): (usize, usize),
            phi: &[f32],
            dphi: &mut [f32],
            (dst, dst_rs): (*mut f32, usize),
            dw: Option<*mut f32>,
            t: &mut [f32],
        ) {
            let (m, r, d, xp) = (self.m, self.r, self.d, Self::row(x, task, t0));
            let (xrs, xcs) = (x.rs(), x.cs());
            // SAFETY: row i < n of this task's gradient, d elements (taken after any GEMM writes it)
            let row = |i: usize| unsafe { std::slice::from_raw_parts_mut(dst.add(i * dst_rs), d) };
            let (ms, ds) = (m as isize, d as isize);
            let inv_sqrt = 1.0 / (r as f32).sqrt();
            // the gradient of the pre-activations P (first r columns of dphi, row stride m), the
            // factor of dP W in dx, and of dPᵀ x in dW
            let s = match self.spec.features {
                FeatureMap::Given => {
                    for (i, dp) in dphi[..n * m].chunks_exact(m).enumerate() {
                        row(i).copy_from_slice(dp);
                    }
                    return;
                }
                FeatureMap::EluPlusOne => {
                    for (i, (dp, p)) in dphi[..n * m].chunks_exact(m).zip(phi.chunks_exact(m)).enumerate() {
                        for (((o, &dp), &p), xv) in row(i).iter_mut().zip(dp).zip(p).zip(self.input_row(x, xp, i)) {
                            *o = if xv > 0.0 { dp } else { dp * p };
                        }
                    }
                    return;
                }
                // dE = dφ ∘ φ
                FeatureMap::Positive { scale } => {
                    dphi[..n * m].iter_mut().zip(phi).for_each(|(g, &p)| *g *= p);
                    scale
                }
                // dP = dφ/√r where P > 0 (φ above its floor)
                FeatureMap::Relu { scale } => {
                    let dphi = &mut dphi[..n * m];
                    dphi.iter_mut().zip(phi).for_each(|(g, &p)| *g = if p > RELU_FLOOR { *g * inv_sqrt } else { 0.0 });
                    scale
                }
                // dP = dφ_sin ∘ cos P/√r − dφ_cos ∘ sin P/√r = dφ_sin ∘ φ_cos − dφ_cos ∘ φ_sin
                FeatureMap::Fourier => {
                    for (dr, pr) in dphi[..n * m].chunks_exact_mut(m).zip(phi.chunks_exact(m)) {
                        let (ds_, dc) = dr.split_at_mut(r);
                        for ((g, &gc), (&ps, &pc)) in ds_.iter_mut().zip(dc.iter()).zip(pr[..r].iter().zip(&pr[r..])) {
                            *g = *g * pc - gc * ps;
                        }
                    }
                    1.0
                }
            };
            let w = self.w(task);
            // dx (positive, ReLU) or dx̂ (Fourier) = s · dP W
            // SAFETY: dP is n × r at row stride m, W is r × d, dst n rows of d
            unsafe { gemm((n, d, r), dst, dst_rs as isize, false, dphi.as_ptr(), (ms, 1), w.as_ptr(), (ds, 1), s) };
            let xin: &[f32] = match self.spec.features {
                FeatureMap::Fourier => {
                    // x̂ into t; dx = (dx̂ − x̂ (x̂·dx̂)) / ‖x‖, or dx̂ / 10⁻⁶ where the floor holds
                    for i in 0..n {
                        let o = row(i);
                        let norm = self.norm(x, xp, i);
                        let inv = 1.0 / norm.max(MIN_NORM);
                        let xh = &mut t[i * d..(i + 1) * d];
                        xh.iter_mut().zip(self.input_row(x, xp, i)).for_each(|(h, v)| *h = v * inv);
                        let along = if norm > MIN_NORM {
                            xh.iter().zip(o.iter()).map(|(a, b)| a * b).sum::<f32>()
                        } else {
                            0.0
                        };
                        o.iter_mut().zip(xh.iter()).for_each(|(o, &h)| *o = (*o - h * along) * inv);
                    }
                    &t[..n * d]
                }
                FeatureMap::Positive { scale } => {
                    // − s² (Σ_r dE_r) x
                    for i in 0..n {
                        let f = scale * scale * dphi[i * m..i * m + r].iter().sum::<f32>();
                        row(i).iter_mut().zip(self.input_row(x, xp, i)).for_each(|(o, xv)| *o -= f * xv);
                    }
                    &[]
                }
                _ => &[],
            };
            if let Some(dw) = dw {
                // dW += s · dPᵀ x (x̂ for Fourier)
                let (lhs, lrc) = (dphi.as_ptr(), (1, ms));
                // SAFETY: dPᵀ is r × n, the inputs n × d, dw r × d
                unsafe {
                    if xin.is_empty() {
                        gemm((r, d, n), dw, ds, true, lhs, lrc, xp, (xrs, xcs), s)
                    } else {
                        gemm((r, d, n), dw, ds, true, lhs, lrc, xin.as_ptr(), (ds, 1), s)
                    }
                }
            }
        }
    }

    /// G_i = Σ_{r ≤ i} a_r inside the chunk at `t0` (zeros without a decay).
    fn cumulative(gate: Option<&[f32]>, t0: usize, n: usize, g: &mut [f32]) {
        let mut acc = 0.0f32;
        for (i, gi) in g[..n].iter_mut().enumerate() {
            if let Some(a) = gate {
                acc += a[t0 + i];
            }
            *gi = acc;
        }
    }

    crate::wide_vectors! {
        /// x ← e^{x − c} · f for x ≤ c (the exponents of positive features, less their scale).
        fn exp_below(x: &mut [f32], c: f32, f: f32) {
            x.iter_mut().for_each(|v| *v = fast_math::exp_neg(*v - c) * f);
        }
    }

    crate::wide_vectors! {
        /// x_j ← x_j e^{G_i − G_j} (G only falls: every exponent is ≤ 0).
        fn decay_row(x: &mut [f32], g: &[f32], gi: f32) {
            x.iter_mut().zip(g).for_each(|(v, &gj)| *v *= fast_math::exp_neg(gi - gj));
        }
    }

    /// A_ij ← A_ij e^{G_i − G_j} for j ≤ i, 0 after.
    fn decay_lower(a: &mut [f32], n: usize, g: &[f32], gated: bool) {
        for i in 0..n {
            let row = &mut a[i * n..(i + 1) * n];
            if gated {
                decay_row(&mut row[..=i], &g[..=i], g[i]);
            }
            row[i + 1..].fill(0.0);
        }
    }

    /// `a` (n × n) := φ(Q) φ(K)ᵀ of the chunk's features.
    fn scores(fq: &[f32], fk: &[f32], n: usize, m: usize, a: &mut [f32]) {
        let ms = m as isize;
        // SAFETY: both hold n × m, a n × n
        unsafe { gemm((n, n, m), a.as_mut_ptr(), n as isize, false, fq.as_ptr(), (ms, 1), fk.as_ptr(), (1, ms), 1.0) }
    }

    /// `out` (n × m) := A F, or Aᵀ F with `transposed`, for the n × n block `a` and features `f`
    /// (n × m): the chunk's dφ(Q) = dA φ(K) and dφ(K) = dAᵀ φ(Q).
    fn block_times(a: &[f32], transposed: bool, f: &[f32], n: usize, m: usize, out: &mut [f32]) {
        let (ns, ms) = (n as isize, m as isize);
        let arc = if transposed { (1, ns) } else { (ns, 1) };
        // SAFETY: a holds n × n, f and out n × m
        unsafe { gemm((n, m, n), out.as_mut_ptr(), ms, false, a.as_ptr(), arc, f.as_ptr(), (ms, 1), 1.0) }
    }

    /// pull[t0 + i] += sign · φ_i·dφ_i for the chunk's n rows (m features each).
    fn add_pulls(pull: &mut [f64], t0: usize, sign: f64, (phi, dphi): (&[f32], &[f32]), n: usize, m: usize) {
        for (i, p) in pull[t0..t0 + n].iter_mut().enumerate() {
            let row = i * m..(i + 1) * m;
            *p += sign * fast_math::dot(&phi[row.clone()], &dphi[row]) as f64;
        }
    }

    /// `a` (n × n) := dN Vᵀ + dd 1ᵀ for the chunk's du `[n, d_v + 1]`.
    fn score_gradients(c: &Call, task: usize, t0: usize, n: usize, du: &[f32], a: &mut [f32]) {
        let (dv, w) = (c.dv, c.dv + 1);
        let vp = Call::row(&c.v, task, t0);
        // SAFETY: du holds n rows, the values rows t0..t0 + n
        unsafe {
            gemm(
                (n, n, dv),
                a.as_mut_ptr(),
                n as isize,
                false,
                du.as_ptr(),
                (w as isize, 1),
                vp,
                (c.v.cs(), c.v.rs()),
                1.0,
            )
        };
        for i in 0..n {
            let dd = du[i * w + dv];
            a[i * n..(i + 1) * n].iter_mut().for_each(|x| *x += dd);
        }
    }

    /// S ← e^{G_n} S + Σ_j e^{G_n − G_j} φ(k_j) [v_j; 1]ᵀ over the chunk (`sv: [m, d_v]`,
    /// `z: [m]`); the keys' features `fk` are scaled in place.
    #[allow(clippy::too_many_arguments)]
    fn carry(
        c: &Call,
        task: usize,
        t0: usize,
        n: usize,
        g: &[f32],
        gated: bool,
        fk: &mut [f32],
        sv: &mut [f32],
        z: &mut [f32],
    ) {
        let (m, dv) = (c.m, c.dv);
        let end = g[n - 1];
        if gated {
            let e = end.exp();
            sv.iter_mut().for_each(|x| *x *= e);
            z.iter_mut().for_each(|x| *x *= e);
        }
        for (j, row) in fk[..n * m].chunks_exact_mut(m).enumerate() {
            if gated {
                let e = (end - g[j]).exp();
                row.iter_mut().for_each(|x| *x *= e);
            }
            z.iter_mut().zip(row.iter()).for_each(|(z, &x)| *z += x);
        }
        let vp = Call::row(&c.v, task, t0);
        // SAFETY: fk holds n × m, the values n rows of d_v
        unsafe {
            gemm(
                (m, dv, n),
                sv.as_mut_ptr(),
                dv as isize,
                true,
                fk.as_ptr(),
                (1, m as isize),
                vp,
                (c.v.rs(), c.v.cs()),
                1.0,
            )
        }
    }

    /// φ of the chunk's queries and keys into the scratch (keys weighted where they are gated).
    fn chunk_features(
        c: &Call,
        task: usize,
        (t0, n): (usize, usize),
        gate: Option<&[f32]>,
        scale: &[f32],
        s: &mut Scratch,
    ) {
        // SAFETY: this chunk's rows of this head's q and k
        unsafe { c.features(&c.q, task, t0, n, &[], &mut s.fq) };
        unsafe { c.features(&c.k, task, t0, n, scale, &mut s.fk) };
        if c.spec.gated_keys {
            c.weigh(gate.expect("gated keys have a decay"), t0, n, &mut s.fk, &mut s.fraw);
        }
    }

    /// The forward pass: the output `[b, L, h · d_v]` and each position's normaliser d_t `[b, h, L]`.
    fn forward(c: &Call) -> (FlexTensor, FlexTensor) {
        let (len, m, dv) = (c.len, c.m, c.dv);
        let tasks = c.tasks();
        let ors = c.out_rs();
        let mut out = vec![0.0f32; tasks * len * dv];
        let mut den = vec![0.0f32; tasks * len];
        let (op, dp) = (Shared(out.as_mut_ptr()), Shared(den.as_mut_ptr()));
        let min = c.spec.min_normaliser;
        (0..tasks).into_par_iter().for_each(|task| {
            let mut s = c.scratch();
            let (gate, scale) = c.decays(task, &mut s);
            let gated = gate.is_some();
            let (mut sv, mut z) = (vec![0.0f32; m * dv], vec![0.0f32; m]);
            for (t0, n) in c.chunks() {
                cumulative(gate.as_deref(), t0, n, &mut s.g);
                chunk_features(c, task, (t0, n), gate.as_deref(), &scale, &mut s);
                let a = &mut s.a[..n * n];
                scores(&s.fq, &s.fk, n, m, a);
                decay_lower(a, n, &s.g, gated);
                // out rows t0..t0 + n of this task (its head's columns), written by this task alone
                let o = op.at(c.out_at(task, t0));
                let vp = Call::row(&c.v, task, t0);
                // SAFETY: a is n × n, the values n rows of d_v, o n rows of d_v at stride ors
                unsafe {
                    gemm((n, dv, n), o, ors as isize, false, a.as_ptr(), (n as isize, 1), vp, (c.v.rs(), c.v.cs()), 1.0)
                };
                if t0 > 0 {
                    // SAFETY: fq is n × m, sv m × d_v, t n × d_v
                    unsafe {
                        gemm(
                            (n, dv, m),
                            s.t.as_mut_ptr(),
                            dv as isize,
                            false,
                            s.fq.as_ptr(),
                            (m as isize, 1),
                            sv.as_ptr(),
                            (dv as isize, 1),
                            1.0,
                        )
                    };
                }
                for i in 0..n {
                    let mut d: f32 = a[i * n..(i + 1) * n].iter().sum();
                    // SAFETY: row t0 + i of this task's output
                    let row = unsafe { std::slice::from_raw_parts_mut(o.add(i * ors), dv) };
                    if t0 > 0 {
                        let e = s.g[i].exp();
                        d += e * s.fq[i * m..(i + 1) * m].iter().zip(&z).map(|(x, y)| x * y).sum::<f32>();
                        row.iter_mut().zip(&s.t[i * dv..(i + 1) * dv]).for_each(|(x, &y)| *x += e * y);
                    }
                    // SAFETY: position t0 + i of this task
                    unsafe { *dp.at(task * len + t0 + i) = d };
                    let inv = 1.0 / d.max(min);
                    row.iter_mut().for_each(|x| *x *= inv);
                }
                if t0 + n < len {
                    carry(c, task, t0, n, &s.g, gated, &mut s.fk, &mut sv, &mut z);
                }
            }
        });
        let [b, h, _, _] = c.q.dims;
        let data = |x: Vec<f32>, dims: Vec<usize>| FlexTensor::from_data(TensorData::new(x, dims));
        (data(out, vec![b, len, h * dv]), data(den, vec![b, h, len]))
    }

    /// The backward pass: dq, dk, dv into `dests` (zeros or written once per element), and the
    /// gradients of a given decay `[b, h, L]` and, when `want_dw`, of W `[h_w, r, d]`.
    fn backward(
        c: &Call,
        out: &[f32],
        den: &[f32],
        grad: &FlexTensor,
        want_dw: bool,
        [dqd, dkd, dvd]: [Dest; 3],
    ) -> (Option<FlexTensor>, Option<FlexTensor>) {
        let (len, m, d, dv, w) = (c.len, c.m, c.d, c.dv, c.dv + 1);
        let tasks = c.tasks();
        let h = c.q.dims[1];
        let grad = grad.to_contiguous();
        let dout = grad.storage::<f32>();
        let min = c.spec.min_normaliser;
        let given = c.gate.is_some();
        let want_dw = want_dw && c.w.is_some();
        let mut da = vec![0.0f32; if given { tasks * len } else { 0 }];
        // one dW per task, summed over the tasks that share a head of W below
        let wsize = c.r * d;
        let mut dw_tasks = vec![0.0f32; if want_dw { tasks * wsize } else { 0 }];
        let ptrs = [da.as_mut_ptr(), dw_tasks.as_mut_ptr()].map(Shared);
        (0..tasks).into_par_iter().for_each(|task| {
            let [dap, dwp] = ptrs;
            let dw = want_dw.then(|| dwp.at(task * wsize));
            // this task's rows of dq, dk, dv from row t0 on, and their row strides
            let rows = |dest: Dest, t0: usize| {
                (dest.head(task / h, task % h).wrapping_add(t0 * dest.strides[2]), dest.strides[2])
            };
            // du = [dn; dd] of the chunk's positions, [C, d_v + 1]
            let mut du = vec![0.0f32; c.cmax() * w];
            let chunk_du = |t0: usize, n: usize, du: &mut [f32]| {
                for (i, row) in du[..n * w].chunks_exact_mut(w).enumerate() {
                    let at = c.out_at(task, t0 + i);
                    let dn = den[task * len + t0 + i];
                    let inv = 1.0 / dn.max(min);
                    let (go, o) = (&dout[at..at + dv], &out[at..at + dv]);
                    row[..dv].iter_mut().zip(go).for_each(|(x, &y)| *x = y * inv);
                    row[dv] = if dn > min { -go.iter().zip(o).map(|(x, y)| x * y).sum::<f32>() * inv } else { 0.0 };
                }
            };
            let mut s = c.scratch();
            let (gate, scale) = c.decays(task, &mut s);
            let gated = gate.is_some();
            // φ·dφ per position for the suffix sum of a given decay, and the gated keys' weights'
            // own term
            let mut pull = vec![0.0f64; if given { len } else { 0 }];
            let mut own = vec![0.0f32; if c.spec.gated_keys { len } else { 0 }];
            let (mut sv, mut z) = (vec![0.0f32; m * dv], vec![0.0f32; m]);
            let mut s1 = vec![0.0f32; m * w]; // [S_v | z] side by side
            // one chunk carries nothing: the reverse sweep alone has what dφ(Q) needs
            let single = len <= c.spec.chunk;
            // forward sweep: dφ(Q_c) = (dU V1ᵀ ∘ E) φ(K_c) + diag(e^G) dU S1ᵀ
            for (t0, n) in c.chunks().filter(|_| !single) {
                cumulative(gate.as_deref(), t0, n, &mut s.g);
                chunk_du(t0, n, &mut du);
                chunk_features(c, task, (t0, n), gate.as_deref(), &scale, &mut s);
                let a = &mut s.a[..n * n];
                score_gradients(c, task, t0, n, &du, a);
                decay_lower(a, n, &s.g, gated);
                let ms = m as isize;
                block_times(a, false, &s.fk, n, m, &mut s.dfq);
                if t0 > 0 {
                    for e in 0..m {
                        s1[e * w..e * w + dv].copy_from_slice(&sv[e * dv..(e + 1) * dv]);
                        s1[e * w + dv] = z[e];
                    }
                    // dU S1ᵀ into t (n × m), added with each row's e^{G_i}
                    let dup = du.as_ptr();
                    // SAFETY: du n × w, s1 m × w, t n × m
                    unsafe {
                        gemm(
                            (n, m, w),
                            s.t.as_mut_ptr(),
                            ms,
                            false,
                            dup,
                            (w as isize, 1),
                            s1.as_ptr(),
                            (1, w as isize),
                            1.0,
                        )
                    };
                    for i in 0..n {
                        let e = s.g[i].exp();
                        let row = &mut s.dfq[i * m..(i + 1) * m];
                        row.iter_mut().zip(&s.t[i * m..(i + 1) * m]).for_each(|(x, &y)| *x += e * y);
                    }
                }
                if given {
                    add_pulls(&mut pull, t0, 1.0, (&s.fq, &s.dfq), n, m);
                }
                // SAFETY: dq rows t0..t0 + n of this task, dW this task's
                unsafe { c.emit(&c.q, task, (t0, n), &s.fq, &mut s.dfq, rows(dqd, t0), dw, &mut s.t) };
                if t0 + n < len {
                    carry(c, task, t0, n, &s.g, gated, &mut s.fk, &mut sv, &mut z);
                }
            }
            // reverse sweep: R = [R_v | R_z] `[m, d_v + 1]`, the later queries' pull on this chunk
            let mut r = vec![0.0f32; m * w];
            for (t0, n) in c.chunks().rev() {
                cumulative(gate.as_deref(), t0, n, &mut s.g);
                chunk_du(t0, n, &mut du);
                chunk_features(c, task, (t0, n), gate.as_deref(), &scale, &mut s);
                let (ms, ws) = (m as isize, w as isize);
                let vp = Call::row(&c.v, task, t0);
                let dup = du.as_ptr();
                let (dvc, dv_rs) = rows(dvd, t0);
                let a = &mut s.a[..n * n];
                // SAFETY (every gemm below): this chunk's rows of this head's inputs and du; dk and
                // dv rows of this task, written by this task alone; scratch sized for a full chunk
                // dV_c = Âᵀ dN, Â = φ(Q) φ(K)ᵀ ∘ E
                scores(&s.fq, &s.fk, n, m, a);
                decay_lower(a, n, &s.g, gated);
                unsafe { gemm((n, dv, n), dvc, dv_rs as isize, false, a.as_ptr(), (1, n as isize), dup, (ws, 1), 1.0) };
                // dφ(K_c) = dÂᵀ φ(Q)
                score_gradients(c, task, t0, n, &du, a);
                decay_lower(a, n, &s.g, gated);
                block_times(a, true, &s.fq, n, m, &mut s.dfk);
                if single {
                    // dφ(Q) = (dU V1ᵀ ∘ E) φ(K), from the same block
                    block_times(a, false, &s.fk, n, m, &mut s.dfq);
                    if given {
                        add_pulls(&mut pull, t0, 1.0, (&s.fq, &s.dfq), n, m);
                    }
                    // SAFETY: dq rows t0..t0 + n of this task, dW this task's
                    unsafe { c.emit(&c.q, task, (t0, n), &s.fq, &mut s.dfq, rows(dqd, t0), dw, &mut s.t) };
                }
                if t0 + n < len {
                    // the later chunks, through R: dV_j += e^{G_n − G_j} R_vᵀ φ(k_j) (the first d_v
                    // columns of φ(K) R), dφ(k_j) += e^{G_n − G_j} (R_v v_j + R_z) (V R_vᵀ, plus R_z)
                    unsafe {
                        gemm((n, w, m), s.t.as_mut_ptr(), ws, false, s.fk.as_ptr(), (ms, 1), r.as_ptr(), (ws, 1), 1.0)
                    };
                    let end = s.g[n - 1];
                    for j in 0..n {
                        let e = if gated { (end - s.g[j]).exp() } else { 1.0 };
                        // SAFETY: row t0 + j of this task's dv
                        let dvrow = unsafe { std::slice::from_raw_parts_mut(dvc.add(j * dv_rs), dv) };
                        dvrow.iter_mut().zip(&s.t[j * w..j * w + dv]).for_each(|(x, &y)| *x += e * y);
                    }
                    unsafe {
                        gemm(
                            (n, m, dv),
                            s.t.as_mut_ptr(),
                            ms,
                            false,
                            vp,
                            (c.v.rs(), c.v.cs()),
                            r.as_ptr(),
                            (1, ws),
                            1.0,
                        )
                    };
                    for j in 0..n {
                        let e = if gated { (end - s.g[j]).exp() } else { 1.0 };
                        let row = &mut s.dfk[j * m..(j + 1) * m];
                        for (e2, x) in row.iter_mut().enumerate() {
                            *x += e * (s.t[j * m + e2] + r[e2 * w + dv]);
                        }
                    }
                }
                if given {
                    add_pulls(&mut pull, t0, -1.0, (&s.fk, &s.dfk), n, m);
                }
                // R ← e^{G_n} R + Σ_i e^{G_i} φ(q_i) du_iᵀ (φ(Q) rows scaled in place)
                if t0 > 0 {
                    if gated {
                        let e = s.g[n - 1].exp();
                        r.iter_mut().for_each(|x| *x *= e);
                        for (i, row) in s.fq[..n * m].chunks_exact_mut(m).enumerate() {
                            let e = s.g[i].exp();
                            row.iter_mut().for_each(|x| *x *= e);
                        }
                    }
                    unsafe { gemm((m, w, n), r.as_mut_ptr(), ws, true, s.fq.as_ptr(), (1, ms), dup, (ws, 1), 1.0) };
                }
                let phi = if c.spec.gated_keys {
                    // through the weight w_t = 1 − e^{a_t}: da_t gains −e^{a_t} φ(k_t)·dφ'(k_t), and
                    // dφ(k_t) = w_t dφ'(k_t)
                    let a = gate.as_deref().expect("gated keys have a decay");
                    for j in 0..n {
                        let (raw, dfk) = (&s.fraw[j * m..(j + 1) * m], &mut s.dfk[j * m..(j + 1) * m]);
                        let ea = a[t0 + j].exp();
                        own[t0 + j] = -ea * fast_math::dot(raw, dfk);
                        dfk.iter_mut().for_each(|x| *x *= 1.0 - ea);
                    }
                    &s.fraw
                } else {
                    &s.fk
                };
                // SAFETY: dk rows t0..t0 + n of this task, dW this task's
                unsafe { c.emit(&c.k, task, (t0, n), phi, &mut s.dfk, rows(dkd, t0), dw, &mut s.t) };
            }
            if given {
                // da_r = Σ_{i ≥ r} (φ(q_i)·dφ(q_i) − φ(k_i)·dφ(k_i)), summed in f64 (a difference
                // of sums), plus the weights' own term
                let mut acc = 0.0f64;
                for i in (0..len).rev() {
                    acc += pull[i];
                    let local = own.get(i).copied().unwrap_or(0.0);
                    // SAFETY: position i of this task
                    unsafe { *dap.at(task * len + i) = acc as f32 + local };
                }
            }
        });
        let b = c.q.dims[0];
        let data = |x: Vec<f32>, dims: Vec<usize>| FlexTensor::from_data(TensorData::new(x, dims));
        let dw = want_dw.then(|| {
            let mut sum = vec![0.0f32; c.hw * wsize];
            for (task, part) in dw_tasks.chunks_exact(wsize).enumerate() {
                let at = c.w_head(task) * wsize;
                sum[at..at + wsize].iter_mut().zip(part).for_each(|(s, &p)| *s += p);
            }
            data(sum, vec![c.hw, c.r, d])
        });
        (given.then(|| data(da, vec![b, h, len])), dw)
    }

    /// q, k and v of a call as views: three tensors, or one packed projection.
    fn views<'a>(inputs: &'a [FlexTensor], form: &Form) -> [Heads<'a>; 3] {
        match form.packed {
            Some(h) => packed_views(&inputs[0], h, h),
            None => [0, 1, 2].map(|i| Heads::of(&inputs[i])),
        }
    }

    /// The inputs as the kernel reads them: q, k, v (or the projection) with non-negative
    /// strides, then the decay and W contiguous.
    fn readable_inputs(tensors: &[&FlexTensor], form: &Form) -> Vec<FlexTensor> {
        let main = if form.packed.is_some() { 1 } else { 3 };
        let mut all: Vec<FlexTensor> = tensors[..main]
            .iter()
            .map(|t| if form.packed.is_some() { readable_packed(t) } else { readable(t) })
            .collect();
        all.extend(tensors[main..].iter().map(|t| t.to_contiguous()));
        all
    }

    /// The call over `inputs` (from [`readable_inputs`]).
    fn call<'a>(inputs: &'a [FlexTensor], form: &Form) -> Call<'a> {
        let main = if form.packed.is_some() { 1 } else { 3 };
        let (a, w) = (&inputs[main], &inputs[main + 1]);
        Call::of(views(inputs, form), form.gate.then_some(a), form.projection.then_some(w), form.spec)
    }

    fn forward_kernel(tensors: &[&FlexTensor], form: Form) -> (FlexTensor, FlexTensor) {
        let inputs = readable_inputs(tensors, &form);
        forward(&call(&inputs, &form))
    }

    impl LinearAttention for Flex {
        fn causal_linear(
            q: FlexTensor,
            k: FlexTensor,
            v: FlexTensor,
            a: FlexTensor,
            w: FlexTensor,
            form: Form,
        ) -> FlexTensor {
            forward_kernel(&[&q, &k, &v, &a, &w], form).0
        }

        fn causal_linear_packed(qkv: FlexTensor, a: FlexTensor, w: FlexTensor, form: Form) -> FlexTensor {
            forward_kernel(&[&qkv, &a, &w], form).0
        }
    }

    #[derive(Debug)]
    struct LinearBackward<const N: usize>;

    /// The inputs (checkpointed), the output and the normalisers, and the call's form.
    #[derive(Debug, Clone)]
    struct Saved {
        nodes: Vec<NodeId>,
        out: FlexTensor,
        den: FlexTensor,
        form: Form,
    }

    impl<const N: usize> Backward<Flex, N> for LinearBackward<N> {
        type State = Saved;

        fn backward(self, ops: Ops<Self::State, N>, grads: &mut Gradients, checkpointer: &mut Checkpointer) {
            let grad = grads.consume::<Flex>(&ops.node);
            let s = ops.state;
            let form = s.form;
            let tensors: Vec<FlexTensor> = s.nodes.iter().map(|&n| checkpointer.retrieve_node_output(n)).collect();
            let inputs = readable_inputs(&tensors.iter().collect::<Vec<_>>(), &form);
            let c = call(&inputs, &form);
            let (out, den) = (s.out.to_contiguous(), s.den.to_contiguous());
            // W's gradient only where autodiff tracks W (Performer's is fixed)
            let want_dw = form.projection && ops.parents[N - 1].is_some();
            let [b, h, len, d] = c.q.dims;
            let dv = c.dv;
            let backward = |dests| backward(&c, out.storage::<f32>(), den.storage::<f32>(), &grad, want_dw, dests);
            let data = |x: Vec<f32>, dims: Vec<usize>| FlexTensor::from_data(TensorData::new(x, dims));
            let computed: Vec<Option<FlexTensor>> = match form.packed {
                Some(_) => {
                    // one gradient in the projection's layout `[b, L, 3 h d]`
                    let width = 3 * h * d;
                    let mut g = vec![0.0f32; b * len * width];
                    let base = g.as_mut_ptr();
                    let dest =
                        |first: usize| Dest { ptr: Shared(base.wrapping_add(first)), strides: [len * width, d, width] };
                    let (da, dw) = backward([dest(0), dest(h * d), dest(2 * h * d)]);
                    vec![Some(data(g, vec![b, len, width])), da, dw]
                }
                None => {
                    let (mut dq, mut dk, mut dvv) =
                        (vec![0.0f32; b * h * len * d], vec![0.0f32; b * h * len * d], vec![0.0f32; b * h * len * dv]);
                    let dest = |x: &mut Vec<f32>, w: usize| Dest {
                        ptr: Shared(x.as_mut_ptr()),
                        strides: [h * len * w, len * w, w],
                    };
                    let dests = [dest(&mut dq, d), dest(&mut dk, d), dest(&mut dvv, dv)];
                    let (da, dw) = backward(dests);
                    let shape = |w: usize| vec![b, h, len, w];
                    vec![Some(data(dq, shape(d))), Some(data(dk, shape(d))), Some(data(dvv, shape(dv))), da, dw]
                }
            };
            // an absent decay or projection (a stand-in) has no gradient: `backward` returns none
            let mut all = computed.into_iter();
            let computed: [Option<FlexTensor>; N] = std::array::from_fn(|_| all.next().flatten());
            crate::register(grads, ops.parents.map(|p| p.map(|n| n.id)), computed);
        }
    }

    fn tracked<C: CheckpointStrategy, const N: usize>(
        tensors: [FloatTensor<Autodiff<Flex, C>>; N],
        form: Form,
    ) -> FloatTensor<Autodiff<Flex, C>> {
        let p: Vec<&FlexTensor> = tensors.iter().map(|t| t.primitive()).collect();
        let (out, den) = forward_kernel(&p, form);
        let nodes = tensors.each_ref().map(|t| t.node());
        match LinearBackward::<N>.prepare::<C>(nodes).compute_bound().stateful() {
            OpsKind::Tracked(mut prep) => {
                let nodes: Vec<NodeId> = tensors.iter().map(|t| prep.checkpoint(t)).collect();
                prep.finish(Saved { nodes, out: out.clone(), den, form }, out)
            }
            OpsKind::UnTracked(prep) => prep.finish(out),
        }
    }

    impl<C: CheckpointStrategy> LinearAttention for Autodiff<Flex, C> {
        fn causal_linear(
            q: FloatTensor<Self>,
            k: FloatTensor<Self>,
            v: FloatTensor<Self>,
            log_gate: FloatTensor<Self>,
            projection: FloatTensor<Self>,
            form: Form,
        ) -> FloatTensor<Self> {
            tracked::<C, 5>([q, k, v, log_gate, projection], form)
        }

        fn causal_linear_packed(
            qkv: FloatTensor<Self>,
            log_gate: FloatTensor<Self>,
            projection: FloatTensor<Self>,
            form: Form,
        ) -> FloatTensor<Self> {
            tracked::<C, 3>([qkv, log_gate, projection], form)
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use crate::test_util::rel_diff;
        use burn::tensor::Distribution;
        use burn::tensor::activation::{elu, relu};

        /// The defining recurrence from Burn's ops, position by position: S_t = g_t S_{t−1} +
        /// k_t [v_t; 1]ᵀ, o_t = n_t / max(d_t, ε).
        fn recurrence(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, a: Option<Tensor<3>>, min: f32) -> Tensor<4> {
            let [b, h, l, m] = q.dims();
            let dv = v.dims()[3];
            let ones = Tensor::ones([b, h, l, 1], &v.device());
            let v1 = Tensor::cat(vec![v, ones], 3);
            let mut s: Tensor<4> = Tensor::zeros([b, h, m, dv + 1], &q.device());
            let mut rows = Vec::new();
            for t in 0..l {
                if let Some(a) = &a {
                    s = s * a.clone().narrow(2, t, 1).exp().reshape([b, h, 1, 1]);
                }
                let kt = k.clone().narrow(2, t, 1).swap_dims(2, 3);
                s = s + kt.matmul(v1.clone().narrow(2, t, 1));
                let u = q.clone().narrow(2, t, 1).matmul(s.clone());
                let (n, d) = (u.clone().narrow(3, 0, dv), u.narrow(3, dv, 1));
                rows.push(n / d.clamp_min(min));
            }
            Tensor::cat(rows, 2)
        }

        /// φ from Burn's ops as the kinds compose it, then the recurrence.
        fn reference(
            q: Tensor<4>,
            k: Tensor<4>,
            v: Tensor<4>,
            a: Option<Tensor<3>>,
            w: Option<Tensor<3>>,
            spec: LinearSpec,
        ) -> Tensor<4> {
            let min = spec.min_normaliser;
            // W as [1, h_w, d, r], broadcast over the batch (and the heads when shared)
            let wt = || w.clone().unwrap().swap_dims(1, 2).unsqueeze_dim::<4>(0);
            let inv_sqrt = || 1.0 / (w.as_ref().unwrap().dims()[1] as f64).sqrt();
            let weigh = |fk: Tensor<4>| match (&a, spec.gated_keys) {
                (Some(a), true) => fk * a.clone().exp().neg().add_scalar(1.0).unsqueeze_dim::<4>(3),
                _ => fk,
            };
            match spec.features {
                FeatureMap::Given => recurrence(q, weigh(k), v, a, min),
                FeatureMap::EluPlusOne => {
                    let phi = |x: Tensor<4>| elu(x, 1.0).add_scalar(1.0);
                    recurrence(phi(q), weigh(phi(k)), v, a, min)
                }
                FeatureMap::Relu { scale } => {
                    let phi =
                        |x: Tensor<4>| relu(x.mul_scalar(scale).matmul(wt())).mul_scalar(inv_sqrt()).add_scalar(1e-3);
                    recurrence(phi(q), weigh(phi(k)), v, a, min)
                }
                FeatureMap::Fourier => {
                    let phi = |x: Tensor<4>| {
                        let norm = x.clone().powf_scalar(2.0).sum_dim(3).sqrt().clamp_min(1e-6);
                        let p = (x / norm).matmul(wt());
                        Tensor::cat(vec![p.clone().sin(), p.cos()], 3).mul_scalar(inv_sqrt())
                    };
                    recurrence(phi(q), weigh(phi(k)), v, a, min)
                }
                FeatureMap::Positive { scale } => {
                    let exponents = |x: Tensor<4>| {
                        let x = x.mul_scalar(scale);
                        x.clone().matmul(wt()) - x.powf_scalar(2.0).sum_dim(3).div_scalar(2.0)
                    };
                    let eq = exponents(q);
                    let fq = (eq.clone() - eq.max_dim(3).detach()).exp().mul_scalar(inv_sqrt());
                    let ek = exponents(k);
                    let [b, h, l, _] = ek.dims();
                    let running = ek.clone().max_dim(3).detach().cummax(2); // M_t, [b, h, l, 1]
                    let before =
                        Tensor::cat(vec![running.clone().narrow(2, 0, 1), running.clone().narrow(2, 0, l - 1)], 2);
                    let a = (before - running.clone()).reshape([b, h, l]);
                    let fk = (ek - running).exp().mul_scalar(inv_sqrt());
                    recurrence(fq, fk, v, Some(a), min)
                }
            }
        }

        /// `[b, L, h · d_v]` → `[b, h, L, d_v]`.
        fn split_heads(y: Tensor<3>, h: usize) -> Tensor<4> {
            let [b, l, hd] = y.dims();
            y.reshape([b, l, h, hd / h]).swap_dims(1, 2)
        }

        struct Case {
            b: usize,
            h: usize,
            l: usize,
            d: usize,
            dv: usize,
            chunk: usize,
            gated: bool,
            min: f32,
            features: FeatureMap,
            /// W's rows per head, and its heads (1 or h), for the projected maps.
            r: usize,
            hw: usize,
            gated_keys: bool,
        }

        const CASE: Case = Case {
            b: 2,
            h: 3,
            l: 11,
            d: 5,
            dv: 4,
            chunk: 4,
            gated: false,
            min: 1e-6,
            features: FeatureMap::Given,
            r: 7,
            hw: 1,
            gated_keys: false,
        };

        fn check(c: Case) {
            let device = Device::flex().autodiff();
            device.seed(21);
            let Case { b, h, l, d, dv, chunk, gated, min, features, r, hw, gated_keys } = c;
            // positive inputs where they are the features; q and k as views of one tensor
            // (strided, as a projection's split hands them over)
            let dist = if features == FeatureMap::Given {
                Distribution::Uniform(0.05, 1.0)
            } else {
                Distribution::Normal(0.0, 1.0)
            };
            let qk: Tensor<4> = Tensor::random([b, l, 2 * h, d], dist, &device).swap_dims(1, 2);
            let (q0, k0) = (qk.clone().narrow(1, 0, h), qk.narrow(1, h, h));
            let v0: Tensor<4> = Tensor::random([b, h, l, dv], Distribution::Normal(0.0, 1.0), &device);
            let a0: Tensor<3> = Tensor::random([b, h, l], Distribution::Uniform(-0.7, -0.01), &device);
            let w0: Tensor<3> = Tensor::random([hw, r, d], Distribution::Normal(0.0, 1.0), &device);
            let projected = features.projected();
            let out: Tensor<4> = Tensor::random([b, h, l, dv], Distribution::Normal(0.0, 1.0), &device);
            let spec = LinearSpec { chunk, min_normaliser: min, features, gated_keys };
            let run = |fused: bool| {
                let (q, k, v, a, w) = (
                    q0.clone().require_grad(),
                    k0.clone().require_grad(),
                    v0.clone().require_grad(),
                    a0.clone().require_grad(),
                    w0.clone().require_grad(),
                );
                let (gate, proj) = (gated.then(|| a.clone()), projected.then(|| w.clone()));
                let y = if fused {
                    let y = causal_linear_attention(q.clone(), k.clone(), v.clone(), gate, proj, spec);
                    split_heads(y.expect("flex has the kernel"), h)
                } else {
                    reference(q.clone(), k.clone(), v.clone(), gate, proj, spec)
                };
                let grads = (y.clone() * out.clone()).sum().backward();
                let mut g = vec![
                    ("dq", q.grad(&grads).unwrap()),
                    ("dk", k.grad(&grads).unwrap()),
                    ("dv", v.grad(&grads).unwrap()),
                ];
                if gated {
                    g.push(("da", a.grad(&grads).unwrap().unsqueeze_dim(3)));
                }
                if projected {
                    g.push(("dW", w.grad(&grads).unwrap().unsqueeze_dim(0)));
                }
                (y, g)
            };
            let ((y1, g1), (y2, g2)) = (run(true), run(false));
            let shape = format!(
                "{features:?}, b {b}, h {h}, L {l}, d {d}, d_v {dv}, chunk {chunk}, gated {gated} (keys {gated_keys}), ε {min}, W {hw}×{r}"
            );
            let e = rel_diff(y1, y2);
            assert!(e < 1e-4, "forward, {shape}: {e}");
            for ((name, x), (_, r)) in g1.into_iter().zip(g2) {
                let e = rel_diff(x, r);
                assert!(e < 1e-4, "{name}, {shape}: {e}");
            }
        }

        #[test]
        fn equals_the_recurrence_with_its_gradients() {
            for gated in [false, true] {
                check(Case { gated, ..CASE });
                check(Case { b: 1, h: 2, l: 9, d: 6, dv: 3, chunk: 1, gated, ..CASE });
                check(Case { b: 1, h: 2, l: 9, d: 6, dv: 3, chunk: 9, gated, ..CASE });
                check(Case { b: 1, h: 1, l: 20, d: 3, dv: 5, chunk: 64, gated, ..CASE });
            }
            // keys that join with weight 1 − g (RFA-Gate)
            check(Case { gated: true, gated_keys: true, ..CASE });
            // many chunks: the decay's gradient is a suffix sum over all of them
            check(Case { b: 1, h: 1, l: 130, d: 4, dv: 3, chunk: 8, gated: true, ..CASE });
        }

        #[test]
        fn every_feature_map_equals_its_composed_form() {
            check(Case { features: FeatureMap::EluPlusOne, ..CASE });
            check(Case { features: FeatureMap::EluPlusOne, gated: true, chunk: 3, ..CASE });
            check(Case { features: FeatureMap::Relu { scale: 0.6 }, ..CASE });
            check(Case { features: FeatureMap::Relu { scale: 0.6 }, l: 20, chunk: 64, r: 12, hw: 3, ..CASE });
            // keys whose largest exponent grows along the sequence move the running maximum
            check(Case { features: FeatureMap::Positive { scale: 0.7 }, ..CASE });
            check(Case { features: FeatureMap::Positive { scale: 0.9 }, l: 21, chunk: 5, r: 16, ..CASE });
            // RFA: shared or per-head frequencies, with and without its gate
            check(Case { features: FeatureMap::Fourier, ..CASE });
            check(Case { features: FeatureMap::Fourier, hw: 3, chunk: 3, ..CASE });
            check(Case { features: FeatureMap::Fourier, hw: 3, gated: true, gated_keys: true, ..CASE });
            check(Case { features: FeatureMap::Relu { scale: 0.6 }, gated: true, gated_keys: true, ..CASE });
            // one chunk: the backward's single sweep
            check(Case { features: FeatureMap::Positive { scale: 0.7 }, chunk: 64, ..CASE });
            check(Case { features: FeatureMap::Fourier, chunk: 64, gated: true, gated_keys: true, ..CASE });
        }

        #[test]
        fn a_normaliser_below_its_floor_passes_no_gradient_through_it() {
            // q·k ≈ 1.4 per key here: with ε = 4 the clamp holds in the first rows and not later
            check(Case { b: 1, h: 2, l: 9, dv: 3, min: 4.0, ..CASE });
            check(Case { b: 1, h: 2, l: 9, dv: 3, min: 4.0, gated: true, ..CASE });
        }

        #[test]
        fn packed_self_attention_equals_separate_inputs() {
            // the packed projection against its q, k, v views, output and gradient, for a map on
            // the inputs, a projected one with a gate and gated keys, and positive features
            let device = Device::flex().autodiff();
            device.seed(8);
            let (b, l, h, d) = (2, 13, 3, 4);
            let qkv0: Tensor<3> = Tensor::random([b, l, 3 * h * d], Distribution::Normal(0.0, 1.0), &device);
            let a0: Tensor<3> = Tensor::random([b, h, l], Distribution::Uniform(-0.7, -0.01), &device);
            // shared frequencies (one head of W for all)
            let w0: Tensor<3> = Tensor::random([1, 6, d], Distribution::Normal(0.0, 1.0), &device);
            let out: Tensor<3> = Tensor::random([b, l, h * d], Distribution::Normal(0.0, 1.0), &device);
            let fourier = LinearSpec { gated_keys: true, ..LinearSpec::new(5, 1e-6, FeatureMap::Fourier) };
            let positive = LinearSpec::new(4, 1e-6, FeatureMap::Positive { scale: 0.7 });
            for (spec, gated) in
                [(LinearSpec::new(5, 1e-6, FeatureMap::EluPlusOne), false), (fourier, true), (positive, false)]
            {
                let run = |packed: bool| {
                    let (x, a, w) = (qkv0.clone().require_grad(), a0.clone().require_grad(), w0.clone().require_grad());
                    let gate = gated.then(|| a.clone());
                    let proj = spec.features.projected().then(|| w.clone());
                    let y = if packed {
                        causal_linear_self_attention(x.clone(), h, gate, proj, spec)
                    } else {
                        let all = x.clone().reshape([b, l, 3 * h, d]).swap_dims(1, 2);
                        let (q, k, v) =
                            (all.clone().narrow(1, 0, h), all.clone().narrow(1, h, h), all.narrow(1, 2 * h, h));
                        causal_linear_attention(q, k, v, gate, proj, spec)
                    };
                    let y = y.expect("flex has the kernel");
                    let grads = (y.clone() * out.clone()).sum().backward();
                    let mut g = vec![x.grad(&grads).unwrap().reshape([b, l * 3 * h * d])];
                    if gated {
                        g.push(a.grad(&grads).unwrap().reshape([b, h * l]));
                    }
                    if spec.features.projected() {
                        g.push(w.grad(&grads).unwrap().reshape([1, 6 * d]));
                    }
                    (y, g)
                };
                let ((y1, g1), (y2, g2)) = (run(true), run(false));
                let e = rel_diff(y1, y2);
                assert!(e < 1e-5, "{:?}: outputs differ by {e}", spec.features);
                for (i, (x, r)) in g1.into_iter().zip(g2).enumerate() {
                    let e = rel_diff(x, r);
                    assert!(e < 1e-5, "{:?}: gradient {i} differs by {e}", spec.features);
                }
            }
        }

        #[test]
        fn no_position_sees_a_later_key() {
            let device = Device::flex();
            device.seed(5);
            let w: Tensor<3> = Tensor::random([1, 8, 4], Distribution::Normal(0.0, 1.0), &device);
            for (features, projection) in [
                (FeatureMap::EluPlusOne, None),
                (FeatureMap::Positive { scale: 0.7 }, Some(w.clone())),
                (FeatureMap::Fourier, Some(w)),
            ] {
                let q: Tensor<4> = Tensor::random([1, 2, 12, 4], Distribution::Normal(0.0, 1.0), &device);
                let k: Tensor<4> = Tensor::random([1, 2, 12, 4], Distribution::Normal(0.0, 1.0), &device);
                let v: Tensor<4> = Tensor::random([1, 2, 12, 3], Distribution::Normal(0.0, 1.0), &device);
                let spec = LinearSpec::new(5, 1e-6, features);
                let y =
                    causal_linear_attention(q.clone(), k.clone(), v.clone(), None, projection.clone(), spec).unwrap();
                // later keys with larger exponents than any before (they would move a maximum
                // taken over the whole sequence)
                let later: Tensor<4> = Tensor::random([1, 2, 4, 4], Distribution::Normal(0.0, 3.0), &device);
                let k2 = k.slice_assign([0..1, 0..2, 8..12, 0..4], later.clone());
                let v2 = v.slice_assign([0..1, 0..2, 8..12, 0..3], later.narrow(3, 0, 3));
                let y2 = causal_linear_attention(q, k2, v2, None, projection, spec).unwrap();
                let d = (y.clone().narrow(1, 0, 8) - y2.clone().narrow(1, 0, 8)).abs().max().into_scalar::<f32>();
                assert_eq!(d, 0.0, "{features:?}: rows 0..8 must not see keys 8..12");
                let d = (y.narrow(1, 8, 4) - y2.narrow(1, 8, 4)).abs().max().into_scalar::<f32>();
                assert!(d > 1e-3, "{features:?}: rows 8.. must see them");
            }
        }
    }
}
