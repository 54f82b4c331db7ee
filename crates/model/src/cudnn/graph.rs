//! cuDNN's backend API as the attention graphs use it: descriptors that destroy themselves, an
//! operation-graph builder (tensors by unique id; pointwise, reduction, matmul and reshape
//! operations), and the execution plan of the first engine cuDNN's heuristics offer that takes
//! a graph. What the graphs are is in `sdpa.rs`.

use std::collections::HashMap;
use std::ffi::{c_void, CStr};

use cudarc::cudnn::sys;

use crate::error::{ModelError, Result};

pub(super) type Name = sys::cudnnBackendAttributeName_t;
pub(super) type Type = sys::cudnnBackendAttributeType_t;
pub(super) type Kind = sys::cudnnBackendDescriptorType_t;
pub(super) type DataType = sys::cudnnDataType_t;
pub(super) type Mode = sys::cudnnPointwiseMode_t;

pub(super) const F32: DataType = DataType::CUDNN_DATA_FLOAT;
pub(super) const BF16: DataType = DataType::CUDNN_DATA_BFLOAT16;

/// Unique ids from here up name the graphs' virtual tensors.
const FIRST_VIRTUAL: i64 = 100;

pub(super) fn check(status: sys::cudnnStatus_t, what: &str) -> Result<()> {
    if status == sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS {
        return Ok(());
    }
    // SAFETY: cudnnGetErrorString returns a static NUL-terminated string for any status.
    let message = unsafe { CStr::from_ptr(sys::cudnnGetErrorString(status)) }
        .to_string_lossy()
        .into_owned();
    Err(ModelError::Cudnn {
        what: what.to_string(),
        message,
    })
}

/// A backend descriptor, destroyed on drop.
pub(super) struct Desc(sys::cudnnBackendDescriptor_t);

impl Desc {
    pub(super) fn new(kind: Kind) -> Result<Desc> {
        let mut d = std::ptr::null_mut();
        // SAFETY: d receives a fresh descriptor.
        check(
            unsafe { sys::cudnnBackendCreateDescriptor(kind, &mut d) },
            &format!("create {kind:?}"),
        )?;
        Ok(Desc(d))
    }

    /// Sets attribute `name` to `values`, each of the C type that `ty` names.
    pub(super) fn set<T: Copy>(&self, name: Name, ty: Type, values: &[T]) -> Result<()> {
        // SAFETY: `values` holds values.len() elements of the type `ty` stands for (the callers
        // pair them: i64 with INT64, bool with BOOLEAN, the enums with their own types).
        check(
            unsafe {
                sys::cudnnBackendSetAttribute(
                    self.0,
                    name,
                    ty,
                    values.len() as i64,
                    values.as_ptr() as *const c_void,
                )
            },
            &format!("set {name:?}"),
        )
    }

    pub(super) fn set_descs(&self, name: Name, descs: &[&Desc]) -> Result<()> {
        let raw: Vec<sys::cudnnBackendDescriptor_t> = descs.iter().map(|d| d.0).collect();
        self.set(name, Type::CUDNN_TYPE_BACKEND_DESCRIPTOR, &raw)
    }

    pub(super) fn finalize(&self) -> Result<()> {
        // SAFETY: a live descriptor.
        check(unsafe { sys::cudnnBackendFinalize(self.0) }, "finalize")
    }

    pub(super) fn get_i64(&self, name: Name) -> Result<i64> {
        let (mut value, mut count) = (0i64, 0i64);
        // SAFETY: one INT64 into `value`.
        check(
            unsafe {
                sys::cudnnBackendGetAttribute(
                    self.0,
                    name,
                    Type::CUDNN_TYPE_INT64,
                    1,
                    &mut count,
                    &mut value as *mut i64 as *mut c_void,
                )
            },
            &format!("get {name:?}"),
        )?;
        Ok(value)
    }
}

impl Desc {
    /// The handle, for the calls this module does not wrap (`cudnnBackendExecute`).
    pub(super) fn raw(&self) -> sys::cudnnBackendDescriptor_t {
        self.0
    }
}

impl Drop for Desc {
    fn drop(&mut self) {
        // SAFETY: created by cudnnBackendCreateDescriptor, destroyed once.
        unsafe {
            sys::cudnnBackendDestroyDescriptor(self.0);
        }
    }
}

/// An operation graph under construction: its tensors (by uid) and operations, in order.
pub(super) struct Graph {
    tensors: HashMap<i64, Desc>,
    /// Pointwise, reduction and matmul descriptors the operations point to.
    parts: Vec<Desc>,
    ops: Vec<Desc>,
    next_virtual: i64,
}

impl Graph {
    pub(super) fn new() -> Graph {
        Graph {
            tensors: HashMap::new(),
            parts: Vec::new(),
            ops: Vec::new(),
            next_virtual: FIRST_VIRTUAL,
        }
    }

    fn tensor(
        &mut self,
        id: i64,
        dtype: DataType,
        dims: [usize; 4],
        strides: [usize; 4],
        is_virtual: bool,
        by_value: bool,
    ) -> Result<i64> {
        let d = Desc::new(Kind::CUDNN_BACKEND_TENSOR_DESCRIPTOR)?;
        let dims = dims.map(|x| x as i64);
        let strides = strides.map(|x| x as i64);
        d.set(
            Name::CUDNN_ATTR_TENSOR_DATA_TYPE,
            Type::CUDNN_TYPE_DATA_TYPE,
            &[dtype],
        )?;
        d.set(
            Name::CUDNN_ATTR_TENSOR_DIMENSIONS,
            Type::CUDNN_TYPE_INT64,
            &dims,
        )?;
        d.set(
            Name::CUDNN_ATTR_TENSOR_STRIDES,
            Type::CUDNN_TYPE_INT64,
            &strides,
        )?;
        d.set(
            Name::CUDNN_ATTR_TENSOR_UNIQUE_ID,
            Type::CUDNN_TYPE_INT64,
            &[id],
        )?;
        d.set(
            Name::CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT,
            Type::CUDNN_TYPE_INT64,
            &[16i64],
        )?;
        if is_virtual {
            d.set(
                Name::CUDNN_ATTR_TENSOR_IS_VIRTUAL,
                Type::CUDNN_TYPE_BOOLEAN,
                &[true],
            )?;
        }
        if by_value {
            d.set(
                Name::CUDNN_ATTR_TENSOR_IS_BY_VALUE,
                Type::CUDNN_TYPE_BOOLEAN,
                &[true],
            )?;
        }
        d.finalize()?;
        self.tensors.insert(id, d);
        Ok(id)
    }

    /// A tensor the caller binds to memory.
    pub(super) fn data(
        &mut self,
        id: i64,
        dtype: DataType,
        dims: [usize; 4],
        strides: [usize; 4],
    ) -> Result<i64> {
        self.tensor(id, dtype, dims, strides, false, false)
    }

    /// An f32 scalar passed by value from the host.
    pub(super) fn scalar(&mut self, id: i64) -> Result<i64> {
        self.tensor(id, F32, [1; 4], [1; 4], false, true)
    }

    /// An intermediate that lives only inside the fused kernel.
    pub(super) fn virt(
        &mut self,
        dtype: DataType,
        dims: [usize; 4],
        strides: [usize; 4],
    ) -> Result<i64> {
        let id = self.next_virtual;
        self.next_virtual += 1;
        self.tensor(id, dtype, dims, strides, true, false)
    }

    fn t(&self, id: i64) -> &Desc {
        &self.tensors[&id]
    }

    /// `y = mode(x, b)` (b is None for unary modes; `t` the condition of BINARY_SELECT;
    /// `axis` that of GEN_INDEX), computed in `prec`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn pointwise_full(
        &mut self,
        mode: Mode,
        prec: DataType,
        axis: Option<i64>,
        x: i64,
        b: Option<i64>,
        t: Option<i64>,
        y: i64,
    ) -> Result<()> {
        let pw = Desc::new(Kind::CUDNN_BACKEND_POINTWISE_DESCRIPTOR)?;
        pw.set(
            Name::CUDNN_ATTR_POINTWISE_MODE,
            Type::CUDNN_TYPE_POINTWISE_MODE,
            &[mode],
        )?;
        pw.set(
            Name::CUDNN_ATTR_POINTWISE_MATH_PREC,
            Type::CUDNN_TYPE_DATA_TYPE,
            &[prec],
        )?;
        if let Some(axis) = axis {
            pw.set(
                Name::CUDNN_ATTR_POINTWISE_AXIS,
                Type::CUDNN_TYPE_INT64,
                &[axis],
            )?;
        }
        pw.finalize()?;
        let op = Desc::new(Kind::CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR)?;
        op.set_descs(Name::CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, &[&pw])?;
        op.set_descs(Name::CUDNN_ATTR_OPERATION_POINTWISE_XDESC, &[self.t(x)])?;
        op.set_descs(Name::CUDNN_ATTR_OPERATION_POINTWISE_YDESC, &[self.t(y)])?;
        if let Some(b) = b {
            op.set_descs(Name::CUDNN_ATTR_OPERATION_POINTWISE_BDESC, &[self.t(b)])?;
        }
        if let Some(t) = t {
            op.set_descs(Name::CUDNN_ATTR_OPERATION_POINTWISE_TDESC, &[self.t(t)])?;
        }
        op.finalize()?;
        self.parts.push(pw);
        self.ops.push(op);
        Ok(())
    }

    pub(super) fn pointwise(&mut self, mode: Mode, x: i64, b: Option<i64>, y: i64) -> Result<()> {
        self.pointwise_full(mode, F32, None, x, b, None, y)
    }

    pub(super) fn reduction(
        &mut self,
        op_kind: sys::cudnnReduceTensorOp_t,
        x: i64,
        y: i64,
    ) -> Result<()> {
        let red = Desc::new(Kind::CUDNN_BACKEND_REDUCTION_DESCRIPTOR)?;
        red.set(
            Name::CUDNN_ATTR_REDUCTION_COMP_TYPE,
            Type::CUDNN_TYPE_DATA_TYPE,
            &[F32],
        )?;
        red.set(
            Name::CUDNN_ATTR_REDUCTION_OPERATOR,
            Type::CUDNN_TYPE_REDUCTION_OPERATOR_TYPE,
            &[op_kind],
        )?;
        red.finalize()?;
        let op = Desc::new(Kind::CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR)?;
        op.set_descs(Name::CUDNN_ATTR_OPERATION_REDUCTION_DESC, &[&red])?;
        op.set_descs(Name::CUDNN_ATTR_OPERATION_REDUCTION_XDESC, &[self.t(x)])?;
        op.set_descs(Name::CUDNN_ATTR_OPERATION_REDUCTION_YDESC, &[self.t(y)])?;
        op.finalize()?;
        self.parts.push(red);
        self.ops.push(op);
        Ok(())
    }

    /// `c = a @ b` over the last two dims, batched over the first two, f32 accumulation.
    pub(super) fn matmul(&mut self, a: i64, b: i64, c: i64) -> Result<()> {
        let mm = Desc::new(Kind::CUDNN_BACKEND_MATMUL_DESCRIPTOR)?;
        mm.set(
            Name::CUDNN_ATTR_MATMUL_COMP_TYPE,
            Type::CUDNN_TYPE_DATA_TYPE,
            &[F32],
        )?;
        mm.finalize()?;
        let op = Desc::new(Kind::CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR)?;
        op.set_descs(Name::CUDNN_ATTR_OPERATION_MATMUL_ADESC, &[self.t(a)])?;
        op.set_descs(Name::CUDNN_ATTR_OPERATION_MATMUL_BDESC, &[self.t(b)])?;
        op.set_descs(Name::CUDNN_ATTR_OPERATION_MATMUL_CDESC, &[self.t(c)])?;
        op.set_descs(Name::CUDNN_ATTR_OPERATION_MATMUL_DESC, &[&mm])?;
        op.finalize()?;
        self.parts.push(mm);
        self.ops.push(op);
        Ok(())
    }

    /// `y` = `x` seen with `y`'s dims, strides and type (a transpose when the strides swap).
    pub(super) fn reshape(&mut self, x: i64, y: i64) -> Result<()> {
        let op = Desc::new(Kind::CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR)?;
        op.set_descs(Name::CUDNN_ATTR_OPERATION_RESHAPE_XDESC, &[self.t(x)])?;
        op.set_descs(Name::CUDNN_ATTR_OPERATION_RESHAPE_YDESC, &[self.t(y)])?;
        op.finalize()?;
        self.ops.push(op);
        Ok(())
    }
}

/// A graph's execution plan and what it points to.
pub(super) struct Plan {
    pub(super) plan: Desc,
    _config: Desc,
    _op_graph: Desc,
    _graph: Graph,
    /// Bytes of scratch the engine needs.
    pub(super) engine_workspace: usize,
}

// SAFETY: the descriptors are only used under the per-stream mutex below.
unsafe impl Send for Plan {}

/// Finalizes `graph` into the plan of the first engine that cuDNN's heuristics (mode A) rank
/// and that takes it.
pub(super) fn build_plan(handle: sys::cudnnHandle_t, graph: Graph) -> Result<Plan> {
    let op_graph = Desc::new(Kind::CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR)?;
    let ops: Vec<&Desc> = graph.ops.iter().collect();
    op_graph.set_descs(Name::CUDNN_ATTR_OPERATIONGRAPH_OPS, &ops)?;
    op_graph.set(
        Name::CUDNN_ATTR_OPERATIONGRAPH_HANDLE,
        Type::CUDNN_TYPE_HANDLE,
        &[handle],
    )?;
    op_graph.finalize()?;

    let heuristics = Desc::new(Kind::CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR)?;
    heuristics.set_descs(Name::CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, &[&op_graph])?;
    heuristics.set(
        Name::CUDNN_ATTR_ENGINEHEUR_MODE,
        Type::CUDNN_TYPE_HEUR_MODE,
        &[sys::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_A],
    )?;
    heuristics.finalize()?;
    let mut available = 0i64;
    // SAFETY: a count query: no elements requested, none written.
    check(
        unsafe {
            sys::cudnnBackendGetAttribute(
                heuristics.0,
                Name::CUDNN_ATTR_ENGINEHEUR_RESULTS,
                Type::CUDNN_TYPE_BACKEND_DESCRIPTOR,
                0,
                &mut available,
                std::ptr::null_mut(),
            )
        },
        "count engine configs",
    )?;
    let configs = (0..available)
        .map(|_| Desc::new(Kind::CUDNN_BACKEND_ENGINECFG_DESCRIPTOR))
        .collect::<Result<Vec<_>>>()?;
    let mut raw: Vec<sys::cudnnBackendDescriptor_t> = configs.iter().map(|d| d.0).collect();
    let mut got = 0i64;
    // SAFETY: `raw` holds `available` created ENGINECFG descriptors for cuDNN to fill.
    check(
        unsafe {
            sys::cudnnBackendGetAttribute(
                heuristics.0,
                Name::CUDNN_ATTR_ENGINEHEUR_RESULTS,
                Type::CUDNN_TYPE_BACKEND_DESCRIPTOR,
                available,
                &mut got,
                raw.as_mut_ptr() as *mut c_void,
            )
        },
        "get engine configs",
    )?;
    let mut last_error = None;
    for config in configs.into_iter().take(got.max(0) as usize) {
        let plan = Desc::new(Kind::CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)?;
        plan.set(
            Name::CUDNN_ATTR_EXECUTION_PLAN_HANDLE,
            Type::CUDNN_TYPE_HANDLE,
            &[handle],
        )?;
        plan.set_descs(Name::CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, &[&config])?;
        match plan.finalize() {
            Ok(()) => {
                let engine_workspace = plan
                    .get_i64(Name::CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE)?
                    .max(0) as usize;
                return Ok(Plan {
                    plan,
                    _config: config,
                    _op_graph: op_graph,
                    _graph: graph,
                    engine_workspace,
                });
            }
            Err(e) => last_error = Some(e),
        }
    }
    Err(last_error.unwrap_or(ModelError::Cudnn {
        what: "plan".into(),
        message: "no engine configuration for this graph".into(),
    }))
}
