//! Real networks (issue 10) through the Rust core against the emulator: TLS trust, HTTP/2 and
//! HTTP/1.1, held response headers, and a start gate that cannot be opened. Each test asserts
//! on what the caller got and on the emulator's request log. (Environment variables are read
//! once per process: those rules are tested from JS in child processes,
//! `__test__/network.test.mjs`, and as pure functions in `net.rs`.)

use std::time::Duration;

use createos_execute_core::abort::Abort;
use createos_execute_core::config::{parse_config, parse_params, Config, Params};
use createos_execute_core::error::Error;
use createos_execute_core::execute::execute;
use createos_test_support::{
    assert_nothing_alive, command_requests, unlimited, with_emulator, Emulator, EmulatorOptions, FaultRule,
};
use serde_json::json;

fn cfg(emu: &Emulator, extra: serde_json::Value) -> Config {
    let mut c = json!({ "apiUrl": emu.url(), "apiKey": emu.api_key(), "timeoutMs": 8000, "pacing": "off" });
    for (k, v) in extra.as_object().unwrap() {
        c[k] = v.clone();
    }
    parse_config(&c).unwrap()
}

fn params(sb: &str, script: &str, stdin: Option<&str>) -> Params {
    let mut p = json!({ "sandboxId": sb, "command": "/bin/bash", "args": ["-c", script] });
    if let Some(s) = stdin {
        p["stdin"] = json!(s);
    }
    parse_params(&p).unwrap()
}

fn tls(http2: bool) -> EmulatorOptions {
    EmulatorOptions { tls: true, http2, ..unlimited() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_without_the_ca_is_an_untrusted_certificate_and_sends_nothing() {
    with_emulator(tls(true), |emu| async move {
        let sb = emu.create_sandbox_now();
        let err = execute(&cfg(&emu, json!({})), &params(&sb, "echo hi", None), Abort::new(), None).await.unwrap_err();
        assert!(matches!(err, Error::UntrustedCertificate { .. }), "{err:?}");
        assert_eq!(err.to_string(), "CreateOS TLS certificate is not trusted.");
        assert!(emu.requests().is_empty(), "the handshake failed before any request: {:?}", emu.requests());
        assert!(emu.connections() >= 1, "a connection was tried");
        assert_nothing_alive(&emu).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_with_ca_cert_pem_over_h2_and_http1() {
    for http2 in [true, false] {
        with_emulator(tls(http2), |emu| async move {
            let sb = emu.create_sandbox_now();
            let c = cfg(&emu, json!({ "caCertPem": emu.ca_pem().unwrap() }));
            for stdin in [None, Some("from stdin\n")] {
                emu.clear_requests();
                let r = execute(&c, &params(&sb, "cat; echo out", stdin), Abort::new(), None).await.unwrap();
                assert_eq!(r.exit_code, Some(0));
                assert_eq!(r.stdout, format!("{}out\n", stdin.unwrap_or("")));
                let reqs = command_requests(&emu);
                assert_eq!(reqs.len(), if stdin.is_some() { 4 } else { 3 }, "{reqs:?}");
                let want = if http2 { "HTTP/2.0" } else { "HTTP/1.1" };
                assert!(reqs.iter().all(|r| r.http_version == want), "{reqs:?}");
                if http2 {
                    // Every request of the command is a stream of one connection.
                    assert!(reqs.iter().all(|r| r.connection == reqs[0].connection), "{reqs:?}");
                }
            }
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_headers_do_not_hold_the_command_until_a_heartbeat() {
    let opts = EmulatorOptions { hold_headers: true, heartbeat_ms: 20_000, ..unlimited() };
    with_emulator(opts, |emu| async move {
        let sb = emu.create_sandbox_now();
        let started = std::time::Instant::now();
        let r = execute(&cfg(&emu, json!({})), &params(&sb, "printf 'a\\nb'", None), Abort::new(), None).await.unwrap();
        assert_eq!((r.exit_code, r.stdout.to_string().as_str()), (Some(0), "a\nb"));
        assert!(started.elapsed() < Duration::from_secs(20), "the command waited for a heartbeat");
        let reqs = command_requests(&emu);
        let routes: Vec<&str> = reqs.iter().map(|r| r.route).collect();
        assert_eq!(routes, ["createProcess", "connect", "putFile"]);
        // The gate was written long before the first heartbeat would have been sent, and its
        // content (its request went out beside the creation) after the connect request.
        let (gate, connect) = (&reqs[2], &reqs[1]);
        let gate_received = gate.received_ms.unwrap();
        assert!(gate_received < connect.at_ms + 20_000.0, "{reqs:?}");
        assert!(
            gate_received >= connect.received_ms.unwrap(),
            "the gate's content went after the connect request: {reqs:?}"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gate_that_cannot_be_opened_is_not_started_and_the_process_is_ended() {
    for status in [403, 429] {
        with_emulator(unlimited(), |emu| async move {
            let sb = emu.create_sandbox_now();
            // The stdin upload (the first putFile) passes; every gate upload fails.
            let rule = json!({ "route": "putFile", "skip": 1, "action": { "kind": "status", "status": status } });
            emu.add_fault(FaultRule::from_json(&rule.to_string()).unwrap());
            let err = execute(&cfg(&emu, json!({})), &params(&sb, "echo never", Some("x")), Abort::new(), None)
                .await
                .unwrap_err();
            assert!(matches!(err, Error::NotStarted), "{status}: {err:?}");
            assert_nothing_alive(&emu).await;
            let reqs = emu.requests();
            let routes: Vec<&str> = reqs.iter().map(|r| r.route).collect();
            assert!(routes.contains(&"deleteProcess"), "{routes:?}");
            // The gate's uploads (the staged stdin's clear after the verdict is refused too).
            let gate = |r: &&createos_test_support::emulator::RequestRecord| r.query.contains("createos-start-");
            let gates = reqs.iter().filter(|r| r.route == "putFile" && r.status == status).filter(gate).count();
            assert_eq!(gates, if status == 429 { 4 } else { 1 }, "{routes:?}");
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_log_consumers_do_not_stall_other_commands_on_the_same_h2_connection() {
    let opts = EmulatorOptions { tls: true, journal_bytes: 64 << 20, ..unlimited() };
    with_emulator(opts, |emu| async move {
        let sb = emu.create_sandbox_now();
        let c = cfg(&emu, json!({ "caCertPem": emu.ca_pem().unwrap(), "timeoutMs": 20_000 }));
        // Four commands write 8 MiB each to a `log` that is never read: their streams stop
        // being read, and each holds whatever flow-control window it was given.
        let mut stalled = Vec::new();
        let mut logs = Vec::new();
        for _ in 0..4 {
            let (tx, rx) = tokio::sync::mpsc::channel(1);
            logs.push(rx);
            let abort = Abort::new();
            let (c, p) = (
                cfg(&emu, json!({ "caCertPem": emu.ca_pem().unwrap(), "timeoutMs": 20_000 })),
                params(&sb, "head -c 8388608 /dev/zero | tr '\\0' a; sleep 30", None),
            );
            let a = abort.clone();
            stalled.push((abort, tokio::spawn(async move { execute(&c, &p, a, Some(tx)).await })));
        }
        tokio::time::sleep(Duration::from_millis(1500)).await;
        // Another command on the same client (so the same HTTP/2 connection) still runs.
        let r = tokio::time::timeout(
            Duration::from_secs(15),
            execute(&c, &params(&sb, "echo free", None), Abort::new(), None),
        )
        .await
        .expect("a command behind stalled streams of its connection did not finish");
        assert_eq!(r.unwrap().stdout, "free\n");
        let reqs = emu.requests();
        // It really shared the connection of the stalled streams.
        let stalled_conns: Vec<u64> =
            reqs[..reqs.len() - 3].iter().filter(|r| r.route == "connect").map(|r| r.connection).collect();
        assert_eq!(stalled_conns.len(), 4, "{reqs:?}");
        assert!(
            reqs[reqs.len() - 3..]
                .iter()
                .all(|r| r.http_version == "HTTP/2.0" && stalled_conns.contains(&r.connection)),
            "{reqs:?}"
        );
        assert!(stalled_conns.iter().all(|c| *c == stalled_conns[0]), "{reqs:?}");
        // The host's log catches up (here: goes away), and the stalled commands are ended.
        drop(logs);
        for (abort, task) in stalled {
            abort.abort(true);
            let r = task.await.unwrap().unwrap();
            assert!(r.timed_out);
        }
        assert_nothing_alive(&emu).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gate_stuck_behind_a_saturated_pacer_never_runs_the_command_and_the_process_is_ended() {
    with_emulator(unlimited(), |emu| async move {
        let sb = emu.create_sandbox_now();
        // Two requests per 2.5 s: the creation and the gate's (held) upload take both slots,
        // so the connect request, and with it the gate's content, waits past the timeout.
        let c = cfg(&emu, json!({ "pacing": { "limit": 2, "windowMs": 2500, "store": false } }));
        let marker = format!("/tmp/createos-never-{}", std::process::id());
        let script = format!("echo ran > {marker}");
        let abort = Abort::new();
        let a = abort.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(800)).await;
            a.abort(true);
        });
        let r = execute(&c, &params(&sb, &script, None), abort, None).await.unwrap();
        // The caller's timeout fired before the command could start: a timeout with no
        // output, never an exit status of the command (no 125 from the gate's own wait).
        assert!(r.timed_out, "{r:?}");
        assert_eq!((r.exit_code, r.stdout.to_string().as_str()), (None, ""));
        assert_nothing_alive(&emu).await;
        let reqs = emu.requests();
        let handled: Vec<&str> = reqs.iter().filter(|r| r.received_ms.is_some()).map(|r| r.route).collect();
        assert_eq!(&handled[..2], ["createProcess", "deleteProcess"], "{reqs:?}");
        assert!(!handled.contains(&"connect"), "{handled:?}");
        let gates: Vec<_> = reqs.iter().filter(|r| r.route == "putFile").collect();
        assert!(gates.iter().all(|g| g.received_ms.is_none()), "the gate's content never went out: {gates:?}");
        // The emulator's /tmp is the host's.
        assert!(!std::path::Path::new(&marker).exists(), "the command never ran");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cold_http1_client_the_gate_request_goes_out_beside_the_creation() {
    // 200 ms round trips make the order of arrivals certain: the creation's answer takes two
    // (handshake, request), so the connect request cannot arrive before 2.5 round trips,
    // while the gate's request (its own connection, opened at once) arrives after 1.5.
    let opts = EmulatorOptions { rtt_ms: 200, http2: false, ..unlimited() };
    with_emulator(opts, |emu| async move {
        let sb = emu.create_sandbox_now();
        let r = execute(&cfg(&emu, json!({})), &params(&sb, "echo hi", None), Abort::new(), None).await.unwrap();
        assert_eq!((r.exit_code, r.stdout.to_string().as_str()), (Some(0), "hi\n"));
        let reqs = command_requests(&emu);
        let routes: Vec<&str> = reqs.iter().map(|r| r.route).collect();
        assert_eq!(routes, ["createProcess", "connect", "putFile"]);
        let (create, connect, gate) = (&reqs[0], &reqs[1], &reqs[2]);
        assert!(gate.at_ms < connect.at_ms, "the gate's request went out before the attach: {reqs:?}");
        assert!(gate.received_ms.unwrap() >= connect.received_ms.unwrap(), "its byte after it: {reqs:?}");
        assert_ne!(gate.connection, create.connection, "a connection of its own, opened beside the creation's");
        // The attach normally reuses the creation's connection (2 in all). hyper's HTTP/1 pool
        // takes a finished connection back from a task of its own, so a request sent the
        // instant the creation's body ended can miss it and open one more; never beyond that.
        let opened = emu.connections();
        assert!((2..=3).contains(&opened), "connections opened: {opened}: {reqs:?}");
        if opened == 2 {
            assert_eq!(connect.connection, create.connection, "{reqs:?}");
        }
    })
    .await;
}

/// A loopback "proxy" that reads each request head and answers it with `answer` (`None`:
/// closes the connection without a word). Returns its URL and the heads it read.
async fn scripted_proxy(answer: Option<&'static str>) -> (String, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://user:proxy-pass@{}", listener.local_addr().unwrap());
    let heads = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = heads.clone();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tokio::time::timeout(Duration::from_secs(5), sock.read(&mut chunk)).await {
                        Ok(Ok(n)) if n > 0 => buf.extend_from_slice(&chunk[..n]),
                        _ => return,
                    }
                }
                seen.lock().unwrap().push(String::from_utf8_lossy(&buf).into_owned());
                if let Some(a) = answer {
                    let _ = sock.write_all(a.as_bytes()).await;
                    let _ = sock.shutdown().await;
                }
            });
        }
    });
    (url, heads)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_that_refuses_or_cannot_be_reached_has_its_own_error_and_nothing_reaches_createos() {
    with_emulator(tls(true), |emu| async move {
        let sb = emu.create_sandbox_now();
        let port = emu.url().rsplit(':').next().unwrap().to_owned();
        let cases: [(Option<&'static str>, &str, &str); 4] = [
            (
                Some("HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm=\"x\"\r\nContent-Length: 0\r\n\r\n"),
                "CreateOS proxy refused the connection (HTTP 407).",
                "CREATEOS_PROXY_REFUSED",
            ),
            (Some("HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n"), "CreateOS proxy refused the connection.", "CREATEOS_PROXY_REFUSED"),
            (Some("HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n"), "CreateOS proxy refused the connection.", "CREATEOS_PROXY_REFUSED"),
            (None, "CreateOS proxy refused the connection.", "CREATEOS_PROXY_REFUSED"),
        ];
        for (answer, message, code) in cases {
            emu.clear_requests();
            let (proxy, heads) = scripted_proxy(answer).await;
            let c = cfg(
                &emu,
                json!({ "apiUrl": format!("https://localhost:{port}"), "proxy": proxy, "caCertPem": emu.ca_pem().unwrap() }),
            );
            let err = execute(&c, &params(&sb, "echo never", None), Abort::new(), None).await.unwrap_err();
            assert_eq!(err.to_string(), message, "{err:?}");
            assert_eq!(err.code(), Some(code));
            assert!(matches!(err, Error::ProxyRefused { .. }), "{err:?}");
            assert!(!format!("{err:?}").contains("proxy-pass"));
            let heads = heads.lock().unwrap().clone();
            assert!(!heads.is_empty() && heads.iter().all(|h| h.starts_with(&format!("CONNECT localhost:{port} "))), "{heads:?}");
            assert!(emu.requests().is_empty(), "{:?}", emu.requests());
        }

        // Nothing listens on the proxy's port.
        let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let c = cfg(
            &emu,
            json!({ "apiUrl": format!("https://localhost:{port}"), "proxy": format!("http://{dead}"), "caCertPem": emu.ca_pem().unwrap() }),
        );
        let err = execute(&c, &params(&sb, "echo never", None), Abort::new(), None).await.unwrap_err();
        assert!(matches!(err, Error::ProxyUnreachable { .. }), "{err:?}");
        assert_eq!(err.to_string(), "CreateOS proxy could not be reached.");
        assert_eq!(err.code(), Some("CREATEOS_PROXY_UNREACHABLE"));
        assert!(emu.requests().is_empty());
        assert_eq!(emu.connections(), 0, "no connection ever reached the emulator");
        assert_nothing_alive(&emu).await;
    })
    .await;
}
