//! What the emulator's HTTP tests share (`mod support;` in each file): a client for one emulator
//! (its URL, key and a reqwest client) and a run that closes the emulator on every path. A test
//! file adds the calls only it needs in an `impl Ctx` of its own.
#![allow(dead_code)] // each test file uses its own subset

use std::future::Future;

use createos_test_support::{with_emulator, Emulator, EmulatorOptions};
use serde_json::{json, Value};

pub trait JsonBody {
    async fn j(self) -> Result<Value, String>;
}

impl JsonBody for reqwest::Response {
    async fn j(self) -> Result<Value, String> {
        let b = self.bytes().await.map_err(|e| e.to_string())?;
        serde_json::from_slice(&b).map_err(|e| format!("{e}: {}", String::from_utf8_lossy(&b)))
    }
}

pub struct Ctx {
    pub emu: Emulator,
    pub http: reqwest::Client,
}

impl Ctx {
    pub fn new(emu: Emulator) -> Self {
        Ctx { emu, http: reqwest::Client::new() }
    }
    pub fn url(&self, path: &str) -> String {
        format!("{}/v1{}", self.emu.url(), path)
    }
    pub fn get(&self, path: &str) -> reqwest::RequestBuilder {
        self.http.get(self.url(path)).header("X-Api-Key", self.emu.api_key())
    }
    pub fn post(&self, path: &str, body: Value) -> reqwest::RequestBuilder {
        self.http
            .post(self.url(path))
            .header("X-Api-Key", self.emu.api_key())
            .header("content-type", "application/json")
            .body(body.to_string())
    }
    pub fn put(&self, path: &str) -> reqwest::RequestBuilder {
        self.http.put(self.url(path)).header("X-Api-Key", self.emu.api_key())
    }
    pub fn delete(&self, path: &str) -> reqwest::RequestBuilder {
        self.http.delete(self.url(path)).header("X-Api-Key", self.emu.api_key())
    }
    /// Sends `r`: its status and its body as JSON (`null` when it is not JSON).
    pub async fn json(&self, r: reqwest::RequestBuilder) -> (u16, Value) {
        let r = r.send().await.unwrap();
        let s = r.status().as_u16();
        let b = r.bytes().await.unwrap();
        (s, serde_json::from_slice(&b).unwrap_or(Value::Null))
    }
    pub async fn sandbox(&self) -> String {
        let (s, v) = self.json(self.post("/sandboxes", json!({}))).await;
        assert_eq!(s, 201, "{v}");
        v["data"]["id"].as_str().unwrap().to_string()
    }
    pub async fn spawn(&self, sb: &str, cmd: &str, args: &[&str]) -> Value {
        let (s, v) =
            self.json(self.post(&format!("/sandboxes/{sb}/processes"), json!({"cmd": cmd, "args": args}))).await;
        assert_eq!(s, 201, "{v}");
        v["data"].clone()
    }
}

/// Runs `f` against a fresh emulator started with `opts` (closed on every path).
pub async fn with_emu<F, Fut>(opts: EmulatorOptions, f: F)
where
    F: FnOnce(Ctx) -> Fut,
    Fut: Future<Output = ()>,
{
    with_emulator(opts, |emu| f(Ctx::new(emu))).await;
}

/// Whether these tests run as root (the private view and cgroup tracking need it).
pub fn is_root() -> bool {
    // SAFETY: geteuid(2) cannot fail and touches no memory of ours.
    unsafe { nix::libc::geteuid() == 0 }
}

/// Whether CI runs these tests (then a test that needs root fails instead of skipping).
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0")
}
