//! `stallscope mcp` driven by the official MCP Python SDK as the client (tests/mcp_client.py,
//! from the virtualenv `cargo xtask setup` makes): it lists the tools and calls each one on
//! stallgen's dataloader job on the simulated GPU; the report of the kept recording names the
//! cause; a bad path is a tool error that names the file and the server goes on; a user who
//! could not record from the command line is refused, with why.
#[allow(
    dead_code,
    reason = "each test binary uses its own part of the shared helpers"
)]
mod common;

use std::{
    io::Write as _,
    path::PathBuf,
    process::{Command, Stdio},
};

use common::{
    Scratch, require_root, serial,
    simgpu::{Sim, dataloader_job},
    stallscope::bin,
};
use serde_json::{Value, json};

/// The tools the issue asks for.
const TOOLS: [&str; 8] = [
    "record", "report", "diff", "check", "doctor", "steps", "what_if", "advice",
];

fn mcp_python() -> PathBuf {
    let python = std::env::var_os("STALLSCOPE_MCP_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
            PathBuf::from(home).join(".cache/stallscope/mcp-venv/bin/python")
        });
    assert!(
        python.exists(),
        "the MCP SDK's virtualenv is not at {}: run `cargo xtask setup`",
        python.display()
    );
    python
}

/// One session of the Python SDK's client with the server `command args`: the tools it
/// listed, and each call's result (`is_error`, `text`).
fn session(command: &str, args: &[String], env: Value, calls: Value) -> (Vec<String>, Vec<Value>) {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("mcp_client.py");
    let plan = json!({"command": command, "args": args, "env": env, "calls": calls});
    let mut child = Command::new(mcp_python())
        .arg(&script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the MCP client starts");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(plan.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the MCP client failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "the client's output is not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    let tools = v["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().to_string())
        .collect();
    (tools, v["results"].as_array().unwrap().clone())
}

fn ok(r: &Value, what: &str) -> String {
    assert_eq!(r["is_error"], false, "{what} failed: {}", r["text"]);
    r["text"].as_str().unwrap().to_string()
}

#[test]
fn an_assistant_records_reports_and_gates_and_a_bad_path_is_an_error_that_keeps_the_server() {
    require_root();
    let _serial = serial();
    let sim = Sim::new("mcp");
    let (job, pid) = dataloader_job(&sim, 60);
    let dir = Scratch::new("mcp");
    let rec = dir.join("job.rec").display().to_string();
    let missing = dir.join("no-such.rec").display().to_string();
    let budget = dir.join("budget.toml");
    // The job idles its GPU most of the time on dataloader_cpu: far over 1%.
    std::fs::write(&budget, "dataloader_cpu = \"1%\"\n").unwrap();
    let nvml = sim.libs.join("libnvidia-ml.so.1").display().to_string();
    let calls = json!([
        ["record", {"pid": pid, "seconds": 4, "output": rec}],
        ["report", {"path": rec}],
        ["report", {"path": missing}],
        ["report", {"path": rec, "sections": ["threads"]}],
        ["report", {"path": rec, "format": "text"}],
        ["diff", {"base": rec, "new": rec}],
        ["check", {"run": rec, "budget": budget.display().to_string()}],
        ["doctor", {"pid": pid}],
        ["steps", {"path": rec}],
        ["what_if", {"path": rec}],
        ["advice", {"path": rec}],
        ["advice", {"path": missing}],
    ]);
    let env = json!({"STALLSCOPE_SIMGPU_STATE": sim.state.display().to_string()});
    // The server's stdout, copied on its way to the client: the protocol's, nothing else.
    let stdout_copy = dir.join("server-stdout.jsonl");
    let (tools, r) = session(
        "sh",
        &[
            "-c".into(),
            format!("\"$0\" \"$@\" | tee {}", stdout_copy.display()),
            bin().display().to_string(),
            "mcp".into(),
            "--nvml-lib".into(),
            nvml,
        ],
        env,
        calls,
    );
    drop(job);
    let copy = std::fs::read_to_string(&stdout_copy).unwrap();
    assert!(
        copy.lines().count() >= 14,
        "the server said little:\n{copy}"
    );
    for line in copy.lines() {
        let msg: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not JSON-RPC on the server's stdout ({e}): {line}"));
        assert_eq!(msg["jsonrpc"], "2.0", "{line}");
    }
    for t in TOOLS {
        assert!(tools.iter().any(|n| n == t), "no tool {t}: {tools:?}");
    }
    let recorded: Value = serde_json::from_str(&ok(&r[0], "record")).unwrap();
    assert_eq!(recorded["recording"], rec.as_str());
    assert!(
        std::path::Path::new(&rec).is_file(),
        "record kept no file at {rec}"
    );
    let summary: Value = serde_json::from_str(&ok(&r[1], "report")).unwrap();
    assert_eq!(
        summary["verdict_cause"], "dataloader_cpu",
        "the summary's verdict: {summary:#}"
    );
    let top = &summary["gpus"][0]["causes"][0];
    assert_eq!(top["cause"], "dataloader_cpu", "{summary:#}");
    assert!(
        summary["sections"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s == "threads"),
        "the summary names the sections it leaves out: {summary:#}"
    );
    assert_eq!(r[2]["is_error"], true, "a missing file: {}", r[2]["text"]);
    assert!(
        r[2]["text"].as_str().unwrap().contains(&missing),
        "the error names the file: {}",
        r[2]["text"]
    );
    assert!(
        r[2].get("protocol_error").is_none(),
        "a tool error, not a protocol error: {}",
        r[2]["text"]
    );
    let threads: Value = serde_json::from_str(&ok(&r[3], "report after an error")).unwrap();
    assert!(
        threads["threads"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["comm"] == "pt_data_worker"),
        "the threads section whole: {threads:#}"
    );
    assert!(ok(&r[4], "report as text").contains("dataloader_cpu"));
    assert!(
        ok(&r[5], "diff").starts_with("exit status 0"),
        "a run against itself: {}",
        r[5]["text"]
    );
    assert!(
        ok(&r[6], "check").starts_with("exit status 1"),
        "a 1% dataloader_cpu budget: {}",
        r[6]["text"]
    );
    assert!(ok(&r[7], "doctor").starts_with("exit status "));
    let steps: Value = serde_json::from_str(&ok(&r[8], "steps")).unwrap();
    assert_eq!(steps[0]["gpu"], 0, "{steps:#}");
    let what_if: Value = serde_json::from_str(&ok(&r[9], "what_if")).unwrap();
    assert!(what_if[0]["what_if"].is_array(), "{what_if:#}");
    let advice: Value = serde_json::from_str(&ok(&r[10], "advice")).unwrap();
    assert!(advice.is_array(), "{advice:#}");
    assert_eq!(r[11]["is_error"], true, "{}", r[11]["text"]);
    assert!(r[11]["text"].as_str().unwrap().contains(&missing));
}

#[test]
fn a_user_who_could_not_record_from_the_command_line_is_refused_with_why() {
    require_root();
    let _serial = serial();
    // nobody, with no capabilities, cannot trace a root process from the command line.
    let setpriv = common::find_tool("setpriv").expect("setpriv (util-linux) is needed");
    let target = std::process::id();
    let (tools, r) = session(
        &setpriv.display().to_string(),
        &[
            "--reuid=65534".into(),
            "--regid=65534".into(),
            "--clear-groups".into(),
            "--inh-caps=-all".into(),
            "--".into(),
            bin().display().to_string(),
            "mcp".into(),
            "--dir".into(),
            "/tmp".into(),
        ],
        json!({}),
        json!([["record", {"pid": target, "seconds": 1}]]),
    );
    assert!(tools.iter().any(|t| t == "record"), "{tools:?}");
    assert_eq!(r[0]["is_error"], true, "nobody recorded: {}", r[0]["text"]);
    let why = r[0]["text"].as_str().unwrap();
    assert!(
        why.contains("insufficient privileges: missing CAP_BPF") && why.contains("sudo "),
        "the refusal says what it lacks and how to run it: {why}"
    );
    assert!(
        r[0].get("protocol_error").is_none(),
        "a tool error, not a protocol error: {why}"
    );
}
