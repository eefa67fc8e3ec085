//! `client::envelope_data` (the JSend envelope) on any answer body: never panics; accepts
//! only `{"status":"success","data":{...}}` and returns exactly that `data`.
#![no_main]

use createos_execute_core::client::envelope_data;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(got) = envelope_data(data) else { return };
    let v: serde_json::Value = serde_json::from_slice(data).expect("accepted body is JSON");
    assert_eq!(v.get("status").and_then(|s| s.as_str()), Some("success"));
    assert_eq!(v.get("data"), Some(&serde_json::Value::Object(got)));
});
