//! The builder behind [`decode_with`](crate::decode_with): plain [`Value`]s, exactly as the full decoder
//! materialises them (anything it would render differently, such as a second BUILD, is declined).

use std::borrow::Cow;

use super::{Builder, Call, CallKind, Declined, Items, Pairs, Sequence};
use crate::value::{Object, ObjectKind, Value};

/// Builds [`Value`]s.
pub(crate) struct ValueBuilder;

impl<'a> Builder<'a> for ValueBuilder {
    type Value = Value;

    fn none(&mut self) -> Value {
        Value::None
    }

    fn bool(&mut self, v: bool) -> Value {
        Value::Bool(v)
    }

    fn int(&mut self, v: i64) -> Value {
        Value::Int(v)
    }

    fn float(&mut self, v: f64) -> Value {
        Value::Float(v)
    }

    fn big_int(&mut self, le_twos: Vec<u8>) -> Result<Value, Declined> {
        Ok(Value::BigInt(le_twos))
    }

    fn str(&mut self, s: Cow<'a, str>) -> Result<Value, Declined> {
        Ok(Value::Str(s.into_owned()))
    }

    fn bytes(&mut self, b: Cow<'a, [u8]>, bytearray: bool) -> Result<Value, Declined> {
        Ok(if bytearray { Value::ByteArray(b.into_owned()) } else { Value::Bytes(b.into_owned()) })
    }

    fn global(&mut self, module: &'a str, name: &'a str) -> Result<Value, Declined> {
        Ok(Value::Global { module: module.to_owned(), name: name.to_owned() })
    }

    fn stack_global(&mut self, module: Value, name: Value) -> Result<Value, Declined> {
        match (module, name) {
            (Value::Str(module), Value::Str(name)) => Ok(Value::Global { module, name }),
            _ => Err(Declined),
        }
    }

    fn sequence(&mut self, kind: Sequence, items: Items<'_, Value>) -> Result<Value, Declined> {
        let items = items.collect();
        Ok(match kind {
            Sequence::List => Value::List(items),
            Sequence::Tuple => Value::Tuple(items),
            Sequence::Set => Value::Set(items),
            Sequence::FrozenSet => Value::FrozenSet(items),
        })
    }

    fn dict(&mut self, pairs: Pairs<'_, Value>) -> Result<Value, Declined> {
        Ok(Value::Dict(pairs.collect()))
    }

    fn persistent_id(&mut self, pid: Value) -> Result<Value, Declined> {
        Ok(Value::PersistentId(Box::new(pid)))
    }

    fn object(&mut self, call: Call<Value>) -> Result<Value, Declined> {
        let kind = match call.kind {
            CallKind::Reduce => ObjectKind::Reduce,
            CallKind::NewObj => ObjectKind::NewObj,
            CallKind::NewObjEx { kwargs } => ObjectKind::NewObjEx { kwargs },
            CallKind::Inst => ObjectKind::Inst,
            CallKind::Obj => ObjectKind::Obj,
        };
        Ok(Value::Object(Box::new(Object::new(kind, call.callable, call.args))))
    }

    fn append(&mut self, target: &mut Value, items: Items<'_, Value>) -> Result<(), Declined> {
        match target {
            Value::List(v) => v.extend(items),
            Value::Object(o) => o.list_items.extend(items),
            _ => return Err(Declined),
        }
        Ok(())
    }

    fn set_items(&mut self, target: &mut Value, pairs: Pairs<'_, Value>) -> Result<(), Declined> {
        match target {
            Value::Dict(v) => v.extend(pairs),
            Value::Object(o) => o.dict_items.extend(pairs),
            _ => return Err(Declined),
        }
        Ok(())
    }

    fn add_items(&mut self, target: &mut Value, items: Items<'_, Value>) -> Result<(), Declined> {
        match target {
            Value::Set(v) => v.extend(items),
            _ => return Err(Declined),
        }
        Ok(())
    }

    fn build(&mut self, target: &mut Value, state: Value) -> Result<(), Declined> {
        match target {
            // A second BUILD merges dict states in the full decoder: left to it.
            Value::Object(o) if o.state.is_none() => o.state = Some(state),
            _ => return Err(Declined),
        }
        Ok(())
    }

    fn share(&mut self, v: &Value) -> Result<Value, Declined> {
        Ok(v.clone())
    }
}
