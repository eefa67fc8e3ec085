//! The emulator's network options (issue 10): HTTPS with ALPN h2/http1.1 from a CA made at
//! start, the emulated round-trip time, `hold_headers`, `heartbeat_ms`, and the per-request
//! `http_version`/`connection` with `connections()`. Real clients (reqwest with the
//! emulator's CA as its only extra root) against real emulators on 127.0.0.1.
//!
//! Timing assertions here are lower bounds only (a delay that must have happened), never
//! upper bounds.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use base64::Engine;
use createos_test_support::{assert_nothing_alive, unlimited, with_emulator, Emulator, EmulatorOptions, FaultRule};
use reqwest::Version;
use serde_json::{json, Value};

fn tls_opts() -> EmulatorOptions {
    EmulatorOptions { tls: true, ..unlimited() }
}

fn addr(emu: &Emulator) -> SocketAddr {
    emu.url().rsplit('/').next().unwrap().parse().unwrap()
}

/// A fresh client (no pooled connection) trusting the emulator's CA.
fn client(emu: &Emulator, h1_only: bool) -> reqwest::Client {
    let mut b = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none());
    if let Some(pem) = emu.ca_pem() {
        b = b.add_root_certificate(reqwest::Certificate::from_pem(pem.as_bytes()).unwrap());
    }
    if h1_only {
        b = b.http1_only();
    }
    b.build().unwrap()
}

fn get(c: &reqwest::Client, emu: &Emulator, path: &str) -> reqwest::RequestBuilder {
    c.get(format!("{}/v1{path}", emu.url())).header("X-Api-Key", emu.api_key())
}

/// One plain HTTP/1.1 connection to the emulator, held by hand. reqwest's pool is no use where
/// a test counts connections: when the idle connection has not reached the pool yet (the
/// body's end gets there a moment after `bytes()` returns), hyper-util races a new connect
/// against it and keeps the loser pooled, so a second request may open a spare connection
/// (seen once in CI). Requests sent here go over this connection and no other.
async fn one_connection(emu: &Emulator) -> hyper::client::conn::http1::SendRequest<String> {
    let tcp = tokio::net::TcpStream::connect(addr(emu)).await.unwrap();
    let (sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp)).await.unwrap();
    tokio::spawn(conn);
    sender
}

/// GET `path` over `sender`, reading the body to its end; returns the status.
async fn h1_get(sender: &mut hyper::client::conn::http1::SendRequest<String>, emu: &Emulator, path: &str) -> u16 {
    sender.ready().await.unwrap();
    let req = hyper::Request::get(format!("/v1{path}"))
        .header("host", addr(emu).to_string())
        .header("X-Api-Key", emu.api_key())
        .body(String::new())
        .unwrap();
    let r = sender.send_request(req).await.unwrap();
    assert_eq!(r.version(), Version::HTTP_11);
    let status = r.status().as_u16();
    let mut body = r.into_body();
    while let Some(frame) =
        std::future::poll_fn(|cx| http_body::Body::poll_frame(std::pin::Pin::new(&mut body), cx)).await
    {
        frame.unwrap();
    }
    status
}

async fn json_of(r: reqwest::Response) -> Value {
    serde_json::from_slice(&r.bytes().await.unwrap()).unwrap()
}

async fn sandbox(c: &reqwest::Client, emu: &Emulator) -> String {
    let r = c
        .post(format!("{}/v1/sandboxes", emu.url()))
        .header("X-Api-Key", emu.api_key())
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    json_of(r).await["data"]["id"].as_str().unwrap().to_string()
}

async fn spawn(c: &reqwest::Client, emu: &Emulator, sb: &str, script: &str) -> String {
    let r = c
        .post(format!("{}/v1/sandboxes/{sb}/processes", emu.url()))
        .header("X-Api-Key", emu.api_key())
        .header("content-type", "application/json")
        .body(json!({"cmd": "bash", "args": ["-c", script]}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    json_of(r).await["data"]["process_id"].as_str().unwrap().to_string()
}

async fn put_file(c: &reqwest::Client, emu: &Emulator, sb: &str, path: &str, body: Vec<u8>) {
    let r = c
        .put(format!("{}/v1/sandboxes/{sb}/files?path={path}", emu.url()))
        .header("X-Api-Key", emu.api_key())
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

fn ndjson(body: &[u8]) -> Vec<Value> {
    body.split(|b| *b == b'\n').filter(|l| !l.is_empty()).map(|l| serde_json::from_slice(l).unwrap()).collect()
}

/// A script that prints `hi` once the file `gate` exists in its workspace.
const GATED: &str = "while [ ! -e gate ]; do sleep 0.02; done; echo hi";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_serves_h2_and_http11_with_its_own_ca() {
    with_emulator(tls_opts(), |emu| async move {
        let url = emu.url();
        assert!(url.starts_with("https://127.0.0.1:"), "{url}");
        let pem = emu.ca_pem().expect("a CA with tls");
        assert!(
            pem.starts_with("-----BEGIN CERTIFICATE-----") && pem.trim_end().ends_with("-----END CERTIFICATE-----")
        );

        // Without the CA: the certificate is refused, and nothing reached the API.
        let untrusting = reqwest::Client::builder().build().unwrap();
        let err = get(&untrusting, &emu, "/whoami").send().await.unwrap_err();
        assert!(err.is_connect() || err.is_request(), "{err:?}");
        assert!(emu.requests().is_empty());
        assert_eq!(emu.connections(), 1);

        // ALPN offers h2 and http/1.1: a client that offers both gets h2 ...
        let h2 = client(&emu, false);
        for _ in 0..2 {
            let r = get(&h2, &emu, "/whoami").send().await.unwrap();
            assert_eq!((r.status().as_u16(), r.version()), (200, Version::HTTP_2));
            assert_eq!(json_of(r).await["data"]["user"], "emulator");
        }
        // ... and one that offers only http/1.1 gets that.
        let h1 = client(&emu, true);
        let r = get(&h1, &emu, "/whoami").send().await.unwrap();
        assert_eq!((r.status().as_u16(), r.version()), (200, Version::HTTP_11));

        let seen: Vec<(&str, u64)> = emu.requests().iter().map(|r| (r.http_version, r.connection)).collect();
        assert_eq!(seen, [("HTTP/2.0", 2), ("HTTP/2.0", 2), ("HTTP/1.1", 3)]);
        assert_eq!(emu.connections(), 3);

        // The leaf is valid for localhost and createos.test too (the proxy tests' name).
        let port = addr(&emu).port();
        for host in ["localhost", "createos.test"] {
            let c = reqwest::Client::builder()
                .add_root_certificate(reqwest::Certificate::from_pem(pem.as_bytes()).unwrap())
                .resolve(host, addr(&emu))
                .build()
                .unwrap();
            let r = c.get(format!("https://{host}:{port}/v1/whoami")).header("X-Api-Key", emu.api_key()).send().await;
            assert_eq!(r.unwrap().status(), 200, "{host}");
        }
        // A name the leaf does not carry is refused.
        let c = reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(pem.as_bytes()).unwrap())
            .resolve("elsewhere.test", addr(&emu))
            .build()
            .unwrap();
        assert!(c.get(format!("https://elsewhere.test:{port}/v1/whoami")).send().await.is_err());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_false_offers_only_http11() {
    with_emulator(EmulatorOptions { http2: false, ..tls_opts() }, |emu| async move {
        let r = get(&client(&emu, false), &emu, "/whoami").send().await.unwrap();
        assert_eq!((r.status().as_u16(), r.version()), (200, Version::HTTP_11));
        // A client that insists on h2 is refused (nothing reaches the API).
        let c = reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(emu.ca_pem().unwrap().as_bytes()).unwrap())
            .http2_prior_knowledge()
            .build()
            .unwrap();
        assert!(get(&c, &emu, "/whoami").send().await.is_err());
        let versions: Vec<&str> = emu.requests().iter().map(|r| r.http_version).collect();
        assert_eq!(versions, ["HTTP/1.1"]);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_keeps_http11_and_accepts_h2_prior_knowledge() {
    with_emulator(unlimited(), |emu| async move {
        assert!(emu.url().starts_with("http://127.0.0.1:"));
        assert_eq!(emu.ca_pem(), None);
        // Two requests on one kept-alive connection ...
        let mut one = one_connection(&emu).await;
        for _ in 0..2 {
            assert_eq!(h1_get(&mut one, &emu, "/whoami").await, 200);
        }
        // ... and reqwest (which offers HTTP/1.1 on plain http) gets HTTP/1.1, not an upgrade.
        let r = get(&client(&emu, false), &emu, "/whoami").send().await.unwrap();
        assert_eq!((r.status().as_u16(), r.version()), (200, Version::HTTP_11));
        let c = reqwest::Client::builder().http2_prior_knowledge().build().unwrap();
        let r = get(&c, &emu, "/whoami").send().await.unwrap();
        assert_eq!((r.status().as_u16(), r.version()), (200, Version::HTTP_2));
        let seen: Vec<(&str, u64)> = emu.requests().iter().map(|r| (r.http_version, r.connection)).collect();
        assert_eq!(seen, [("HTTP/1.1", 1), ("HTTP/1.1", 1), ("HTTP/1.1", 2), ("HTTP/2.0", 3)]);
        assert_eq!(emu.connections(), 3);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rtt_delays_plain_http_by_its_round_trips() {
    const RTT: Duration = Duration::from_millis(120);
    with_emulator(EmulatorOptions { rtt_ms: 120, ..unlimited() }, |emu| async move {
        // Fresh connection: handshake + request/response = 2 round trips at least.
        let t = Instant::now();
        let mut one = one_connection(&emu).await;
        assert_eq!(h1_get(&mut one, &emu, "/whoami").await, 200);
        let cold = t.elapsed();
        assert!(cold >= 2 * RTT, "fresh connection took {cold:?}");
        // Reused connection: one round trip at least.
        let t = Instant::now();
        assert_eq!(h1_get(&mut one, &emu, "/whoami").await, 200);
        let warm = t.elapsed();
        assert!(warm >= RTT, "reused connection took {warm:?}");
        assert_eq!(emu.connections(), 1);
        let conns: Vec<u64> = emu.requests().iter().map(|r| r.connection).collect();
        assert_eq!(conns, [1, 1]);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rtt_over_tls_costs_the_handshake_and_keeps_bytes_in_order() {
    const RTT: Duration = Duration::from_millis(100);
    with_emulator(EmulatorOptions { rtt_ms: 100, ..tls_opts() }, |emu| async move {
        let c = client(&emu, false);
        // TCP (1) + TLS 1.3 (1) + the request (1).
        let t = Instant::now();
        let r = get(&c, &emu, "/whoami").send().await.unwrap();
        assert_eq!((r.status().as_u16(), r.version()), (200, Version::HTTP_2));
        let cold = t.elapsed();
        assert!(cold >= 3 * RTT, "fresh TLS connection took {cold:?}");

        // Bytes cross the delayed link intact and in order, both ways (4 MiB, several
        // segments in flight at once).
        let sb = sandbox(&c, &emu).await;
        let data: Vec<u8> = (0..4u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        put_file(&c, &emu, &sb, "/workspace/blob", data.clone()).await;
        let back =
            get(&c, &emu, &format!("/sandboxes/{sb}/files?path=/workspace/blob")).send().await.unwrap().bytes().await;
        assert!(back.unwrap() == data, "the file came back different");
        assert_eq!(emu.connections(), 1);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_connection_fault_still_aborts_over_tls_and_rtt() {
    with_emulator(EmulatorOptions { rtt_ms: 20, ..tls_opts() }, |emu| async move {
        emu.add_fault(
            serde_json::from_value::<FaultRule>(
                json!({"route": "whoami", "times": 1, "action": {"kind": "dropConnection"}}),
            )
            .unwrap(),
        );
        let c = client(&emu, true);
        assert!(get(&c, &emu, "/whoami").send().await.is_err());
        assert_eq!(get(&c, &emu, "/whoami").send().await.unwrap().status(), 200);
        let seen: Vec<(u16, u64)> = emu.requests().iter().map(|r| (r.status, r.connection)).collect();
        assert_eq!(seen, [(0, 1), (200, 2)]);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_headers_sends_connect_headers_with_the_first_frame() {
    // A long heartbeat: with held headers, nothing but output can release the head.
    with_emulator(EmulatorOptions { hold_headers: true, heartbeat_ms: 30_000, ..tls_opts() }, |emu| async move {
        let c = client(&emu, false);
        let sb = sandbox(&c, &emu).await;
        let pid = spawn(&c, &emu, &sb, GATED).await;
        let connect = tokio::spawn(get(&c, &emu, &format!("/sandboxes/{sb}/processes/{pid}/connect?after=0")).send());
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(!connect.is_finished(), "the connect head arrived before any frame");
        assert_eq!(emu.requests().last().unwrap().route, "connect");
        put_file(&c, &emu, &sb, "/workspace/gate", Vec::new()).await;
        let r = connect.await.unwrap().unwrap();
        assert_eq!(r.status(), 200);
        let frames = ndjson(&r.bytes().await.unwrap());
        assert_eq!(frames[0]["type"], "data", "{frames:?}");
        let first = base64::engine::general_purpose::STANDARD.decode(frames[0]["data_base64"].as_str().unwrap());
        assert_eq!(first.unwrap(), b"hi\n");
        assert_eq!(frames.last().unwrap()["type"], "exit");
        assert_nothing_alive(&emu).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_headers_go_out_at_once_by_default() {
    with_emulator(EmulatorOptions { heartbeat_ms: 30_000, ..unlimited() }, |emu| async move {
        let c = client(&emu, false);
        let sb = sandbox(&c, &emu).await;
        let pid = spawn(&c, &emu, &sb, GATED).await;
        // The head arrives while the process has written nothing and no heartbeat is due.
        let r = get(&c, &emu, &format!("/sandboxes/{sb}/processes/{pid}/connect?after=0")).send().await.unwrap();
        assert_eq!(r.status(), 200);
        put_file(&client(&emu, false), &emu, &sb, "/workspace/gate", Vec::new()).await;
        let frames = ndjson(&r.bytes().await.unwrap());
        assert_eq!(frames[0]["type"], "data", "{frames:?}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_headers_come_with_the_first_heartbeat() {
    const HB: Duration = Duration::from_millis(400);
    with_emulator(EmulatorOptions { hold_headers: true, heartbeat_ms: 400, ..unlimited() }, |emu| async move {
        let c = client(&emu, false);
        let sb = sandbox(&c, &emu).await;
        let pid = spawn(&c, &emu, &sb, "sleep 1.5; echo late").await;
        let t = Instant::now();
        let mut r = get(&c, &emu, &format!("/sandboxes/{sb}/processes/{pid}/connect?after=0")).send().await.unwrap();
        let head = t.elapsed();
        assert!(head >= HB, "held head arrived after {head:?}, before the first heartbeat was due");
        let chunk = r.chunk().await.unwrap().unwrap();
        assert_eq!(ndjson(&chunk)[0], json!({"type": "heartbeat"}));
        let rest = r.bytes().await.unwrap();
        let frames = ndjson(&rest);
        let data: Vec<&Value> = frames.iter().filter(|f| f["type"] == "data").collect();
        assert_eq!(data.len(), 1, "{frames:?}");
        assert_eq!(frames.last().unwrap()["type"], "exit");
        // The heartbeat interval applies to the rest of the stream too (1.5 s of silence).
        assert!(frames.iter().any(|f| f["type"] == "heartbeat"), "{frames:?}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_range_heartbeat_or_rtt_is_refused() {
    for o in [
        EmulatorOptions { heartbeat_ms: 0, ..unlimited() },
        EmulatorOptions { heartbeat_ms: u64::MAX, ..unlimited() },
        EmulatorOptions { rtt_ms: 60_001, ..unlimited() },
    ] {
        let err = createos_test_support::emulator::start(o).await.err().expect("refused");
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput, "{err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_after_frames_over_h2_resets_the_stream_after_the_frames() {
    with_emulator(EmulatorOptions { rtt_ms: 10, ..tls_opts() }, |emu| async move {
        let c = client(&emu, false);
        let sb = sandbox(&c, &emu).await;
        let pid = spawn(&c, &emu, &sb, "for i in 1 2 3 4 5; do echo $i; sleep 0.03; done").await;
        let w = get(&c, &emu, &format!("/sandboxes/{sb}/processes/{pid}/wait?scope=tree&timeout_ms=5000")).send();
        assert_eq!(w.await.unwrap().status(), 200);
        emu.add_fault(
            FaultRule::from_json(r#"{"route":"connect","times":1,"action":{"kind":"dropAfterFrames","frames":2}}"#)
                .unwrap(),
        );
        let mut r = get(&c, &emu, &format!("/sandboxes/{sb}/processes/{pid}/connect")).send().await.unwrap();
        assert_eq!((r.status().as_u16(), r.version()), (200, Version::HTTP_2));
        let mut got = Vec::new();
        let errored = loop {
            match r.chunk().await {
                Ok(Some(b)) => got.extend_from_slice(&b),
                Ok(None) => break false,
                Err(_) => break true,
            }
        };
        assert!(errored, "the stream must end abruptly");
        let seqs: Vec<u64> = ndjson(&got).iter().map(|l| l["seq"].as_u64().unwrap()).collect();
        assert_eq!(seqs, [1, 2]);
        // The stream was reset, not the connection: the replay goes over the same one.
        let body = get(&c, &emu, &format!("/sandboxes/{sb}/processes/{pid}/connect?after=2")).send().await.unwrap();
        let frames = ndjson(&body.bytes().await.unwrap());
        let seqs: Vec<u64> = frames.iter().filter_map(|l| l["seq"].as_u64()).collect();
        assert_eq!(seqs, [3, 4, 5]);
        assert_eq!(emu.connections(), 1);
    })
    .await;
}
