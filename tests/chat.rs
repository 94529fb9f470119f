//! `conductor chat`: commands, history and Ctrl-C, driven through stdin on the default model.

mod common;

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn saved(path: &std::path::Path) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(path).expect("the conversation was saved");
    let value: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    value["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| {
            (
                m["role"].as_str().expect("role").to_string(),
                m["content"].as_str().expect("content").to_string(),
            )
        })
        .collect()
}

fn chat() -> Command {
    let mut cmd = common::conductor();
    cmd.args(["chat", "-t", "1", "--temp", "0", "-m"])
        .arg(common::default_model())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

#[test]
fn chat_keeps_history_and_obeys_system_reset_and_save() {
    let dir = common::ScratchDir::new("chat-commands");
    let first = dir.path().join("first.json");
    let second = dir.path().join("second.json");
    let mut child = chat()
        .args(["-n", "12", "-c", "1024"])
        .spawn()
        .expect("chat starts");
    let script = format!(
        "/system You answer briefly.\nWhat is the capital of France?\nAnd of Italy?\n/save {}\n/reset\n/save {}\n/nonsense\n/quit\n",
        first.display(),
        second.display()
    );
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(script.as_bytes())
        .expect("write the script");
    let out = child.wait_with_output().expect("chat ends");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let messages = saved(&first);
    let roles: Vec<&str> = messages.iter().map(|(r, _)| r.as_str()).collect();
    assert_eq!(
        roles,
        ["system", "user", "assistant", "user", "assistant"],
        "{messages:?}"
    );
    assert_eq!(messages[0].1, "You answer briefly.");
    assert_eq!(messages[3].1, "And of Italy?");
    assert!(!messages[2].1.is_empty() && !messages[4].1.is_empty());
    // The answers were streamed to stdout.
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains(messages[2].1.trim()), "{stdout}");
    assert!(stdout.contains(messages[4].1.trim()), "{stdout}");
    // After /reset only the system message is left.
    assert_eq!(
        saved(&second),
        [("system".to_string(), "You answer briefly.".to_string())]
    );
    assert!(stderr.contains("unknown command /nonsense"), "{stderr}");
}

#[test]
fn ctrl_c_stops_the_answer_not_the_program() {
    let dir = common::ScratchDir::new("chat-ctrl-c");
    let file = dir.path().join("after.json");
    let mut child = chat()
        .args(["-n", "3000", "-c", "4096", "--ignore-eos"])
        .spawn()
        .expect("chat starts");
    let mut stdin = child.stdin.take().expect("stdin");
    let mut stdout = child.stdout.take().expect("stdout");
    stdin
        .write_all(b"Tell me a very long story.\n")
        .expect("ask");
    // Wait for the answer to flow: the prompt "> " and some text after it.
    let mut seen = Vec::new();
    let mut buf = [0u8; 256];
    while seen.len() < 40 {
        let n = stdout.read(&mut buf).expect("read the answer");
        assert!(n > 0, "chat ended: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    common::signal(&child, rustix::process::Signal::INT);
    stdin
        .write_all(format!("/save {}\n/quit\n", file.display()).as_bytes())
        .expect("the program still reads commands");
    drop(stdin);
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "chat did not stop its answer after Ctrl-C"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    let _ = child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr);
    assert!(status.success(), "{status}: {stderr}");
    assert!(stderr.contains("(stopped)"), "{stderr}");
    let messages = saved(&file);
    assert_eq!(messages.len(), 2, "{messages:?}");
    assert_eq!(messages[1].0, "assistant");
    assert!(!messages[1].1.is_empty());
}
