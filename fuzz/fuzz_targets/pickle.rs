//! The pickle decoder on arbitrary bytes; whatever it accepts must re-encode (protocols 2 to 5) into
//! bytes it accepts again.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(value) = ckpt_pickle::decode(data) else { return };
    let value = value.desugar();
    for protocol in 2..=5 {
        if let Ok(bytes) = ckpt_pickle::encode(&value, protocol)
            && let Err(e) = ckpt_pickle::decode(&bytes)
        {
            panic!("protocol {protocol}: the encoder wrote a pickle the decoder rejects: {e}");
        }
    }
});
