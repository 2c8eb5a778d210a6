//! Attention kinds defined outside this crate. A user's crate implements [`AttentionKind`] on its
//! config and [`AttentionMechanism`] on its module, exactly as a built-in kind does, and calls
//! [`register`] once at start-up: from then on `kind = "<name>"` selects it in any config, and it
//! is validated, listed in `variorum zoo`, trained, decoded, saved and checked by the generic
//! harness like every other kind (`examples/own-attention`).
//!
//! Burn modules need concrete types, and `Box<dyn …>` is not a `Module`: [`ExternalAttention`]
//! is a hand-written `Module` around a boxed mechanism. Burn's visitor and mapper traits are
//! generic over the tensor rank, so they cannot cross a `dyn` boundary as they are; here they
//! cross it with the parameter as `dyn Any` and its rank, and are downcast back on the other
//! side ([`ErasedVisitor`], [`ErasedMapper`]), for parameters of rank 1 to 8. Configs cross it
//! as a `serde_json::Value` (parsing) and through the same object-safe methods the registry
//! calls on built-in kinds ([`DynKind`]).

use core::any::Any;
use core::fmt::Debug;
use std::sync::RwLock;

use burn::module::{
    Content, Devices, Flag, ModuleDisplay, ModuleDisplayDefault, ModuleMapper, ModuleVisitor, Param, ParamId,
};
use burn::prelude::*;
use serde::{Serialize, Serializer};
use variorum_core::{AttentionMask, Capabilities, ConfigError, KindInfo};
use variorum_position::HeadShape;

use crate::contract::{AttentionInput, AttentionOutput};
use crate::kind::{AttentionKind, AttentionMechanism, LayerInit, Learned, TestVariant};
use crate::registry::AttentionConfig;
use crate::state::AttentionState;

/// One registered kind: its name, zoo row, parser and test variants.
struct Entry {
    kind: &'static str,
    info: KindInfo,
    parse: fn(serde_json::Value) -> Result<Box<dyn DynKind>, String>,
    variants: fn(&'static str) -> Vec<TestVariant<AttentionConfig>>,
}

static REGISTRY: RwLock<Vec<Entry>> = RwLock::new(Vec::new());

/// Makes `kind = "<kind>"` select `C` in every config parsed from now on. Refuses a name a
/// built-in kind has, or one already registered for another type (registering the same type
/// under the same name again does nothing, so tests may call it freely).
pub fn register<C: AttentionKind>(kind: &'static str) -> Result<(), ConfigError> {
    if AttentionConfig::builtin_kinds().contains(&kind) {
        return Err(ConfigError::new(format!(
            "attention kind \"{kind}\" is built in: register your kind under another name"
        )));
    }
    let mut registry = REGISTRY.write().unwrap_or_else(|e| e.into_inner());
    let parse: fn(serde_json::Value) -> Result<Box<dyn DynKind>, String> = parse::<C>;
    if let Some(e) = registry.iter().find(|e| e.kind == kind) {
        return if core::ptr::fn_addr_eq(e.parse, parse) {
            Ok(())
        } else {
            Err(ConfigError::new(format!("attention kind \"{kind}\" is already registered for another type")))
        };
    }
    registry.push(Entry {
        kind,
        info: KindInfo { axis: "model.attention", kind, summary: C::SUMMARY, paper: C::PAPER, caps: C::CAPS },
        parse,
        variants: variants::<C>,
    });
    Ok(())
}

fn parse<C: AttentionKind>(value: serde_json::Value) -> Result<Box<dyn DynKind>, String> {
    serde_json::from_value::<C>(value).map(|c| Box::new(c) as Box<dyn DynKind>).map_err(|e| e.to_string())
}

fn variants<C: AttentionKind>(kind: &'static str) -> Vec<TestVariant<AttentionConfig>> {
    C::test_variants()
        .into_iter()
        .map(|v| TestVariant {
            name: format!("attention {kind} {}", v.name).trim_end().to_string(),
            config: AttentionConfig::External(ExternalConfig { kind, config: Box::new(v.config) }),
            masked: v.masked,
            position: v.position,
        })
        .collect()
}

/// The names of the registered kinds, in registration order.
pub fn registered_kinds() -> Vec<&'static str> {
    REGISTRY.read().unwrap_or_else(|e| e.into_inner()).iter().map(|e| e.kind).collect()
}

/// The zoo rows of the registered kinds.
pub(crate) fn zoo() -> Vec<KindInfo> {
    REGISTRY.read().unwrap_or_else(|e| e.into_inner()).iter().map(|e| e.info).collect()
}

/// The test variants of the registered kinds.
pub(crate) fn test_variants() -> Vec<TestVariant<AttentionConfig>> {
    let registry = REGISTRY.read().unwrap_or_else(|e| e.into_inner());
    registry.iter().flat_map(|e| (e.variants)(e.kind)).collect()
}

/// The config of registered kind `kind` from its table (the `kind` key included).
pub(crate) fn parse_registered(kind: &str, mut table: serde_json::Value) -> Result<ExternalConfig, String> {
    let registry = REGISTRY.read().unwrap_or_else(|e| e.into_inner());
    let entry = registry.iter().find(|e| e.kind == kind).ok_or_else(|| format!("unknown attention kind `{kind}`"))?;
    if let Some(map) = table.as_object_mut() {
        map.remove("kind");
    }
    (entry.parse)(table).map(|config| ExternalConfig { kind: entry.kind, config })
}

/// What the registry asks of a config, object-safe; implemented for every [`AttentionKind`].
pub trait DynKind: Debug + Send + Sync {
    fn clone_box(&self) -> Box<dyn DynKind>;
    fn to_value(&self) -> serde_json::Value;
    fn capabilities(&self) -> Capabilities;
    fn why_not_causal(&self) -> &'static str;
    fn inexact_causality(&self) -> Option<&'static str>;
    fn expanded(&self, d_model: usize) -> Box<dyn DynKind>;
    fn validate(&self, d_model: usize) -> Result<(), ConfigError>;
    fn validate_len(&self, len: usize) -> Result<(), ConfigError>;
    fn for_length(&self, len: usize) -> Box<dyn DynKind>;
    fn head_shape(&self, d_model: usize) -> HeadShape;
    fn dropout(&self) -> f64;
    fn flops_per_token(&self, d_model: usize, len_k: usize) -> u64;
    fn for_layer(&self, layer: usize) -> Box<dyn DynKind>;
    fn per_layer(&self) -> usize;
    fn per_layer_key(&self) -> &'static str;
    fn scores_every_key(&self) -> bool;
    fn tags(&self) -> Option<usize>;
    fn shows_what_it_learned(&self) -> bool;
    fn build(&self, init: &LayerInit, device: &Device) -> Box<dyn DynMechanism>;
}

impl<C: AttentionKind> DynKind for C {
    fn clone_box(&self) -> Box<dyn DynKind> {
        Box::new(self.clone())
    }
    fn to_value(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }
    fn capabilities(&self) -> Capabilities {
        AttentionKind::capabilities(self)
    }
    fn why_not_causal(&self) -> &'static str {
        AttentionKind::why_not_causal(self)
    }
    fn inexact_causality(&self) -> Option<&'static str> {
        AttentionKind::inexact_causality(self)
    }
    fn expanded(&self, d_model: usize) -> Box<dyn DynKind> {
        Box::new(AttentionKind::expanded(self, d_model))
    }
    fn validate(&self, d_model: usize) -> Result<(), ConfigError> {
        AttentionKind::validate(self, d_model)
    }
    fn validate_len(&self, len: usize) -> Result<(), ConfigError> {
        AttentionKind::validate_len(self, len)
    }
    fn for_length(&self, len: usize) -> Box<dyn DynKind> {
        Box::new(AttentionKind::for_length(self, len))
    }
    fn head_shape(&self, d_model: usize) -> HeadShape {
        AttentionKind::head_shape(self, d_model)
    }
    fn dropout(&self) -> f64 {
        AttentionKind::dropout(self)
    }
    fn flops_per_token(&self, d_model: usize, len_k: usize) -> u64 {
        AttentionKind::flops_per_token(self, d_model, len_k)
    }
    fn for_layer(&self, layer: usize) -> Box<dyn DynKind> {
        Box::new(AttentionKind::for_layer(self, layer))
    }
    fn per_layer(&self) -> usize {
        AttentionKind::per_layer(self)
    }
    fn per_layer_key(&self) -> &'static str {
        AttentionKind::per_layer_key(self)
    }
    fn scores_every_key(&self) -> bool {
        AttentionKind::scores_every_key(self)
    }
    fn shows_what_it_learned(&self) -> bool {
        AttentionKind::shows_what_it_learned(self)
    }
    fn tags(&self) -> Option<usize> {
        AttentionKind::tags(self)
    }
    fn build(&self, init: &LayerInit, device: &Device) -> Box<dyn DynMechanism> {
        Box::new(AttentionKind::build(self, init, device))
    }
}

/// A registered kind's config: its name and its settings.
#[derive(Debug)]
pub struct ExternalConfig {
    /// The name the kind was registered under, `kind = "<name>"`.
    pub kind: &'static str,
    /// Its settings, behind the object-safe methods the registry calls (`DynKind`).
    pub config: Box<dyn DynKind>,
}

impl ExternalConfig {
    pub(crate) fn with(&self, config: Box<dyn DynKind>) -> Self {
        Self { kind: self.kind, config }
    }
}

impl Clone for ExternalConfig {
    fn clone(&self) -> Self {
        self.with(self.config.clone_box())
    }
}

impl PartialEq for ExternalConfig {
    /// Same kind, same settings (compared as their serialised tables).
    fn eq(&self, other: &Self) -> bool {
        self.kind == other.kind && self.config.to_value() == other.config.to_value()
    }
}

/// Null values removed (TOML has none: an unset optional field is left out, as the derived
/// serialisers of the built-in kinds do).
fn without_nulls(value: serde_json::Value) -> serde_json::Value {
    match value {
        serde_json::Value::Object(map) => serde_json::Value::Object(
            map.into_iter().filter(|(_, v)| !v.is_null()).map(|(k, v)| (k, without_nulls(v))).collect(),
        ),
        serde_json::Value::Array(items) => serde_json::Value::Array(items.into_iter().map(without_nulls).collect()),
        other => other,
    }
}

impl Serialize for ExternalConfig {
    /// The kind's table with `kind = "<name>"`, as a built-in kind's is written.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let fields = match without_nulls(self.config.to_value()) {
            serde_json::Value::Object(map) => map,
            other => {
                return Err(serde::ser::Error::custom(format!(
                    "attention kind \"{}\" is not a table: {other}",
                    self.kind
                )));
            }
        };
        let mut map = serializer.serialize_map(Some(fields.len() + 1))?;
        map.serialize_entry("kind", self.kind)?;
        for (k, v) in &fields {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

/// What the registry and Burn ask of a mechanism, object-safe; implemented for every
/// [`AttentionMechanism`].
pub trait DynMechanism: Debug + Send {
    fn clone_box(&self) -> Box<dyn DynMechanism>;
    fn forward(&self, input: AttentionInput, state: Option<&mut AttentionState>) -> AttentionOutput;
    fn extend_cache(&self, x: Tensor<3>, mask: &AttentionMask, state: &mut AttentionState);
    fn cross_attention(&self, input: AttentionInput, state: &mut AttentionState) -> AttentionOutput;
    fn content_only(&self, query: Tensor<3>, key_value: Tensor<3>) -> Tensor<3>;
    fn uses_dense_mask(&self) -> bool;
    fn global_segment(&self) -> Option<usize>;
    fn global_token_ids(&self) -> &[u32];
    fn after_optimizer_step(&mut self, step: usize);
    fn after_partial_load(&mut self, fresh: &dyn Fn(&str) -> bool);
    fn remembers(&self) -> bool;
    fn learned(&self) -> Option<Learned>;
    fn reset_rows(&self, state: &mut AttentionState, rows: &[bool]);
    fn collect_devices(&self, devices: Devices) -> Devices;
    fn fork(self: Box<Self>, device: &Device) -> Box<dyn DynMechanism>;
    fn to_device(self: Box<Self>, device: &Device) -> Box<dyn DynMechanism>;
    fn train(self: Box<Self>) -> Box<dyn DynMechanism>;
    fn valid(&self) -> Box<dyn DynMechanism>;
    fn materialize(self: Box<Self>) -> Box<dyn DynMechanism>;
    fn num_params(&self) -> usize;
    fn visit(&self, visitor: &mut dyn ErasedVisitor);
    fn map(self: Box<Self>, mapper: &mut dyn ErasedMapper) -> Box<dyn DynMechanism>;
    fn content(&self, content: Content) -> Option<Content>;
}

impl<M: AttentionMechanism + 'static> DynMechanism for M {
    fn clone_box(&self) -> Box<dyn DynMechanism> {
        Box::new(self.clone())
    }
    fn forward(&self, input: AttentionInput, state: Option<&mut AttentionState>) -> AttentionOutput {
        AttentionMechanism::forward(self, input, state)
    }
    fn extend_cache(&self, x: Tensor<3>, mask: &AttentionMask, state: &mut AttentionState) {
        AttentionMechanism::extend_cache(self, x, mask, state)
    }
    fn cross_attention(&self, input: AttentionInput, state: &mut AttentionState) -> AttentionOutput {
        AttentionMechanism::cross_attention(self, input, state)
    }
    fn content_only(&self, query: Tensor<3>, key_value: Tensor<3>) -> Tensor<3> {
        AttentionMechanism::content_only(self, query, key_value)
    }
    fn uses_dense_mask(&self) -> bool {
        AttentionMechanism::uses_dense_mask(self)
    }
    fn global_segment(&self) -> Option<usize> {
        AttentionMechanism::global_segment(self)
    }
    fn global_token_ids(&self) -> &[u32] {
        AttentionMechanism::global_token_ids(self)
    }
    fn after_optimizer_step(&mut self, step: usize) {
        AttentionMechanism::after_optimizer_step(self, step)
    }
    fn after_partial_load(&mut self, fresh: &dyn Fn(&str) -> bool) {
        AttentionMechanism::after_partial_load(self, fresh)
    }
    fn remembers(&self) -> bool {
        AttentionMechanism::remembers(self)
    }
    fn learned(&self) -> Option<Learned> {
        AttentionMechanism::learned(self)
    }
    fn reset_rows(&self, state: &mut AttentionState, rows: &[bool]) {
        AttentionMechanism::reset_rows(self, state, rows)
    }
    fn collect_devices(&self, devices: Devices) -> Devices {
        Module::collect_devices(self, devices)
    }
    fn fork(self: Box<Self>, device: &Device) -> Box<dyn DynMechanism> {
        Box::new(Module::fork(*self, device))
    }
    fn to_device(self: Box<Self>, device: &Device) -> Box<dyn DynMechanism> {
        Box::new(Module::to_device(*self, device))
    }
    fn train(self: Box<Self>) -> Box<dyn DynMechanism> {
        Box::new(Module::train(*self))
    }
    fn valid(&self) -> Box<dyn DynMechanism> {
        Box::new(Module::valid(self))
    }
    fn materialize(self: Box<Self>) -> Box<dyn DynMechanism> {
        Box::new(Module::materialize(*self))
    }
    fn num_params(&self) -> usize {
        Module::num_params(self)
    }
    fn visit(&self, visitor: &mut dyn ErasedVisitor) {
        Module::visit(self, &mut Unerased(visitor));
    }
    fn map(self: Box<Self>, mapper: &mut dyn ErasedMapper) -> Box<dyn DynMechanism> {
        Box::new(Module::map(*self, &mut UnerasedMapper(mapper)))
    }
    fn content(&self, content: Content) -> Option<Content> {
        ModuleDisplayDefault::content(self, content)
    }
}

/// A registered kind's initialised mechanism.
#[derive(Debug)]
pub struct ExternalAttention(pub Box<dyn DynMechanism>);

impl Clone for ExternalAttention {
    fn clone(&self) -> Self {
        Self(self.0.clone_box())
    }
}

impl Module for ExternalAttention {
    fn collect_devices(&self, devices: Devices) -> Devices {
        self.0.collect_devices(devices)
    }
    fn fork(self, device: &Device) -> Self {
        Self(self.0.fork(device))
    }
    fn to_device(self, device: &Device) -> Self {
        Self(self.0.to_device(device))
    }
    fn train(self) -> Self {
        Self(self.0.train())
    }
    fn valid(&self) -> Self {
        Self(self.0.valid())
    }
    fn materialize(self) -> Self {
        Self(self.0.materialize())
    }
    fn num_params(&self) -> usize {
        self.0.num_params()
    }
    fn visit<V: ModuleVisitor>(&self, visitor: &mut V) {
        self.0.visit(visitor);
    }
    fn map<M: ModuleMapper>(self, mapper: &mut M) -> Self {
        Self(self.0.map(mapper))
    }
}

impl ModuleDisplayDefault for ExternalAttention {
    fn content(&self, content: Content) -> Option<Content> {
        self.0.content(content)
    }
}

impl ModuleDisplay for ExternalAttention {}

impl AttentionMechanism for ExternalAttention {
    fn forward(&self, input: AttentionInput, state: Option<&mut AttentionState>) -> AttentionOutput {
        self.0.forward(input, state)
    }
    fn extend_cache(&self, x: Tensor<3>, mask: &AttentionMask, state: &mut AttentionState) {
        self.0.extend_cache(x, mask, state)
    }
    fn cross_attention(&self, input: AttentionInput, state: &mut AttentionState) -> AttentionOutput {
        self.0.cross_attention(input, state)
    }
    fn content_only(&self, query: Tensor<3>, key_value: Tensor<3>) -> Tensor<3> {
        self.0.content_only(query, key_value)
    }
    fn uses_dense_mask(&self) -> bool {
        self.0.uses_dense_mask()
    }
    fn global_segment(&self) -> Option<usize> {
        self.0.global_segment()
    }
    fn global_token_ids(&self) -> &[u32] {
        self.0.global_token_ids()
    }
    fn after_optimizer_step(&mut self, step: usize) {
        self.0.after_optimizer_step(step)
    }
    fn after_partial_load(&mut self, fresh: &dyn Fn(&str) -> bool) {
        self.0.after_partial_load(fresh)
    }
    fn remembers(&self) -> bool {
        self.0.remembers()
    }
    fn learned(&self) -> Option<Learned> {
        self.0.learned()
    }
    fn reset_rows(&self, state: &mut AttentionState, rows: &[bool]) {
        self.0.reset_rows(state, rows)
    }
}

/// Calls `$on!(D)` for the rank `$rank` (1 to 8), or panics naming the limit.
macro_rules! for_rank {
    ($rank:expr, $on:ident) => {
        match $rank {
            1 => $on!(1),
            2 => $on!(2),
            3 => $on!(3),
            4 => $on!(4),
            5 => $on!(5),
            6 => $on!(6),
            7 => $on!(7),
            8 => $on!(8),
            d => panic!("a registered attention kind has a parameter of rank {d}; ranks 1 to 8 are supported"),
        }
    };
}

/// A [`ModuleVisitor`] across a `dyn` boundary: each parameter as `dyn Any` and its rank.
pub trait ErasedVisitor {
    fn enter_module(&mut self, name: &str, container_type: &str);
    fn exit_module(&mut self, name: &str, container_type: &str);
    /// `param`: a `Param<Tensor<rank>>`, `Param<Tensor<rank, Int>>` or `Param<Tensor<rank, Bool>>`.
    fn visit_param(&mut self, param: &dyn Any, rank: usize);
    fn visit_flag(&mut self, flag: &Param<Flag>);
    /// `tensor`: a `Tensor<rank>`, `Tensor<rank, Int>` or `Tensor<rank, Bool>`.
    fn visit_with_path(&mut self, path: &[String], id: ParamId, tensor: &dyn Any, rank: usize);
}

impl<V: ModuleVisitor> ErasedVisitor for V {
    fn enter_module(&mut self, name: &str, container_type: &str) {
        ModuleVisitor::enter_module(self, name, container_type)
    }
    fn exit_module(&mut self, name: &str, container_type: &str) {
        ModuleVisitor::exit_module(self, name, container_type)
    }
    fn visit_param(&mut self, param: &dyn Any, rank: usize) {
        macro_rules! visit {
            ($d:literal) => {
                if let Some(p) = param.downcast_ref::<Param<Tensor<$d>>>() {
                    self.visit_float::<$d>(p)
                } else if let Some(p) = param.downcast_ref::<Param<Tensor<$d, Int>>>() {
                    self.visit_int::<$d>(p)
                } else if let Some(p) = param.downcast_ref::<Param<Tensor<$d, Bool>>>() {
                    self.visit_bool::<$d>(p)
                }
            };
        }
        for_rank!(rank, visit)
    }
    fn visit_flag(&mut self, flag: &Param<Flag>) {
        ModuleVisitor::visit_flag(self, flag)
    }
    fn visit_with_path(&mut self, path: &[String], id: ParamId, tensor: &dyn Any, rank: usize) {
        macro_rules! visit {
            ($d:literal) => {
                if let Some(t) = tensor.downcast_ref::<Tensor<$d>>() {
                    self.visit_float_with_path::<$d>(path, id, t)
                } else if let Some(t) = tensor.downcast_ref::<Tensor<$d, Int>>() {
                    self.visit_int_with_path::<$d>(path, id, t)
                } else if let Some(t) = tensor.downcast_ref::<Tensor<$d, Bool>>() {
                    self.visit_bool_with_path::<$d>(path, id, t)
                }
            };
        }
        for_rank!(rank, visit)
    }
}

/// The user module's side of the boundary: a concrete [`ModuleVisitor`] forwarding to the erased one.
struct Unerased<'a>(&'a mut dyn ErasedVisitor);

impl ModuleVisitor for Unerased<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        self.0.visit_param(param, D)
    }
    fn visit_int<const D: usize>(&mut self, param: &Param<Tensor<D, Int>>) {
        self.0.visit_param(param, D)
    }
    fn visit_bool<const D: usize>(&mut self, param: &Param<Tensor<D, Bool>>) {
        self.0.visit_param(param, D)
    }
    fn visit_flag(&mut self, flag: &Param<Flag>) {
        self.0.visit_flag(flag)
    }
    fn enter_module(&mut self, name: &str, container_type: &str) {
        self.0.enter_module(name, container_type)
    }
    fn exit_module(&mut self, name: &str, container_type: &str) {
        self.0.exit_module(name, container_type)
    }
    fn visit_float_with_path<const D: usize>(&mut self, path: &[String], id: ParamId, tensor: &Tensor<D>) {
        self.0.visit_with_path(path, id, tensor, D)
    }
    fn visit_int_with_path<const D: usize>(&mut self, path: &[String], id: ParamId, tensor: &Tensor<D, Int>) {
        self.0.visit_with_path(path, id, tensor, D)
    }
    fn visit_bool_with_path<const D: usize>(&mut self, path: &[String], id: ParamId, tensor: &Tensor<D, Bool>) {
        self.0.visit_with_path(path, id, tensor, D)
    }
}

/// A [`ModuleMapper`] across a `dyn` boundary: each parameter boxed as `dyn Any` with its rank,
/// handed back the same way.
pub trait ErasedMapper {
    fn enter_module(&mut self, name: &str, container_type: &str);
    fn exit_module(&mut self, name: &str, container_type: &str);
    /// `param`: a boxed `Param<Tensor<rank>>` (or `Int`, `Bool`); returns the same type.
    fn map_param(&mut self, param: Box<dyn Any>, rank: usize) -> Box<dyn Any>;
    fn map_flag(&mut self, flag: Param<Flag>) -> Param<Flag>;
}

impl<M: ModuleMapper> ErasedMapper for M {
    fn enter_module(&mut self, name: &str, container_type: &str) {
        ModuleMapper::enter_module(self, name, container_type)
    }
    fn exit_module(&mut self, name: &str, container_type: &str) {
        ModuleMapper::exit_module(self, name, container_type)
    }
    fn map_param(&mut self, param: Box<dyn Any>, rank: usize) -> Box<dyn Any> {
        macro_rules! map {
            ($d:literal) => {{
                let param = match param.downcast::<Param<Tensor<$d>>>() {
                    Ok(p) => return Box::new(self.map_float::<$d>(*p)),
                    Err(other) => other,
                };
                let param = match param.downcast::<Param<Tensor<$d, Int>>>() {
                    Ok(p) => return Box::new(self.map_int::<$d>(*p)),
                    Err(other) => other,
                };
                match param.downcast::<Param<Tensor<$d, Bool>>>() {
                    Ok(p) => Box::new(self.map_bool::<$d>(*p)),
                    Err(other) => other,
                }
            }};
        }
        for_rank!(rank, map)
    }
    fn map_flag(&mut self, flag: Param<Flag>) -> Param<Flag> {
        ModuleMapper::map_flag(self, flag)
    }
}

struct UnerasedMapper<'a>(&'a mut dyn ErasedMapper);

impl UnerasedMapper<'_> {
    fn map_any<P: 'static>(&mut self, param: P, rank: usize) -> P {
        *self.0.map_param(Box::new(param), rank).downcast::<P>().expect("a mapper returns the type it was given")
    }
}

impl ModuleMapper for UnerasedMapper<'_> {
    fn enter_module(&mut self, name: &str, container_type: &str) {
        self.0.enter_module(name, container_type)
    }
    fn exit_module(&mut self, name: &str, container_type: &str) {
        self.0.exit_module(name, container_type)
    }
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        self.map_any(param, D)
    }
    fn map_int<const D: usize>(&mut self, param: Param<Tensor<D, Int>>) -> Param<Tensor<D, Int>> {
        self.map_any(param, D)
    }
    fn map_bool<const D: usize>(&mut self, param: Param<Tensor<D, Bool>>) -> Param<Tensor<D, Bool>> {
        self.map_any(param, D)
    }
    fn map_flag(&mut self, flag: Param<Flag>) -> Param<Flag> {
        self.0.map_flag(flag)
    }
}
