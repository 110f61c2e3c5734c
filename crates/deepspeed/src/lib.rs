//! Read DeepSpeed checkpoints — ZeRO stages 1, 2 and 3 at any data-parallel world size, and universal
//! checkpoints (`ds_to_universal`) — without torch or DeepSpeed: the consolidated fp32 weights equal bit for
//! bit to DeepSpeed's `get_fp32_state_dict_from_zero_checkpoint`, the module's own fp16/bf16 weights, the
//! optimizer state per parameter, and the client state.
//!
//! A DeepSpeed checkpoint root holds `latest` (the tag of the last save) and one directory per tag
//! (`global_step14/`): the model states (`mp_rank_00_model_states.pt`; in ZeRO 3 one
//! `zero_pp_rank_R_mp_rank_00_model_states.pt` per rank) and one optimizer states file per data-parallel rank
//! (`[bf16_]zero_pp_rank_R_mp_rank_00_optim_states.pt`) whose flat fp32 groups hold the rank's partition of
//! the master weights. bf16 training with fp32 gradient accumulation (ZeRO stage 1) saves the state of
//! DeepSpeed's `BF16_Optimizer` instead ([`Kind::Bf16Optimizer`]: `single_partition_of_fp32_groups`,
//! `group_paddings`, `param_slice_mappings`, no `zero_stage`; DeepSpeed's own `zero_to_fp32` refuses it):
//! its parameters are joined from the ranks' fragments that `param_slice_mappings` locates, with the same
//! entries as a ZeRO checkpoint's. [`DeepSpeedReader`] opens a root (the tag in `latest`, or one chosen with
//! [`ReadOptions::with_tag`]) or a tag directory, and lays the parameters out of the ranks' partitions as
//! DeepSpeed's consolidation does ([`zero`](crate) module docs: stages 1 and 2 split each param group over the
//! ranks, stage 3 splits each parameter), with frozen, tied and buffer entries, several param groups, fp16
//! and bf16 mixed precision.
//!
//! ```no_run
//! use ckpt_tensor::CheckpointRead;
//! let ck = ckpt_deepspeed::DeepSpeedReader::open("checkpoints/")?;   // the tag in `latest`
//! for (name, t) in ck.model() {                                                // fp32, as zero_to_fp32
//!     println!("{name} {:?} {:?}", t.dtype(), t.shape());
//! }
//! let exp_avg = ck.tensor("optimizer.state.lm_head.weight.exp_avg")?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Memory
//! Files are memory-mapped and nothing is copied when opening. A parameter held by one rank's flat group is
//! a view of the file; one split over ranks (or over flat groups) is a tensor whose bytes are made from the
//! pieces when read — any range of them on its own ([`ckpt_tensor::Buffer::deferred_ranged`]) — so that a
//! writer streaming the consolidated state dict holds one piece of one parameter at a time, never the
//! model.
//!
//! # Safety on hostile input
//! The files are read by `ckpt-torch`, whose pickle decoder never imports or calls anything: DeepSpeed's
//! classes (`LossScaler`, `ZeroStageEnum`, `fragment_address`) are inert objects. Every offset and length
//! taken from the files is checked against the tensors that hold the data before a view is made.
//!
//! # Limitations
//! Model-parallel (tensor or pipeline parallel) and expert-parallel checkpoints are refused, as DeepSpeed's
//! own consolidation refuses them. Writing ZeRO checkpoints is not supported.

#![forbid(unsafe_code)]

mod bf16_optimizer;
mod error;
mod files;
mod gather;
mod reader;
mod universal;
mod zero;

pub use error::{Error, Result};
pub use files::{LATEST, LATEST_UNIVERSAL};
pub use reader::{DeepSpeedReader, Kind, ReadOptions};
