//! `stallscope mcp`: a Model Context Protocol server on stdio (the official Rust SDK, rmcp).
//! Each tool runs the command line a user would type (command_line.rs), so it has the CLI's
//! privileges and messages; a report comes back compacted (profiler_core's compact.rs), the
//! verdict, causes and advice first and the rest by section on request. A tool that fails
//! says why as a tool error and the server goes on.
mod command_line;

use std::{path::PathBuf, time::Duration};

use profiler_core::report::{
    compact::{self, Compact},
    json::{ReportDoc, read_report},
};
use rmcp::{
    ErrorData, ServerHandler, ServiceExt as _,
    handler::server::{router::tool::ToolRouter, wrapper::Parameters},
    model::{CallToolResult, ContentBlock, Implementation, ServerCapabilities, ServerConfig},
    schemars::JsonSchema,
    tool, tool_handler, tool_router,
};
use serde::Deserialize;

use crate::cli::McpArgs;
use command_line::Stallscope;

/// The longest `record` takes: an assistant's request should not hold a job's probes for long.
const MAX_RECORD_SECS: u32 = 600;
/// What a recorder may take past its duration: attaching, the report, removing the probes.
const RECORD_GRACE: Duration = Duration::from_secs(120);
/// A command that only reads files.
const READ_LIMIT: Duration = Duration::from_secs(600);

pub fn run(args: McpArgs) -> anyhow::Result<i32> {
    let server = Server::new(args)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let running = server
            .serve(rmcp::transport::stdio())
            .await
            .map_err(|e| anyhow::anyhow!("starting the MCP session on stdio: {e}"))?;
        running
            .waiting()
            .await
            .map_err(|e| anyhow::anyhow!("the MCP session: {e}"))?;
        anyhow::Ok(())
    })?;
    Ok(0)
}

#[derive(Clone)]
pub struct Server {
    stallscope: std::sync::Arc<Stallscope>,
    dir: Option<PathBuf>,
    /// The folder made for recordings when no `--dir` was given, once one was needed.
    made_dir: std::sync::Arc<std::sync::Mutex<Option<PathBuf>>>,
    nvml_lib: Option<PathBuf>,
    tool_router: ToolRouter<Self>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct RecordArgs {
    /// The training job's PID (its threads and child processes are traced too).
    pub pid: u32,
    /// How long to record, in seconds (at most 600).
    pub seconds: u32,
    /// Where to write the recording (default: a private folder, said in the result).
    pub output: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct ReportArgs {
    /// A recording (.rec) or a JSON report.
    pub path: String,
    /// `summary` (default: the verdict, causes and advice, compact), `text`, `markdown` or
    /// `json` (the whole report: large).
    pub format: Option<String>,
    /// With `summary`: parts of the report to give whole (`threads`, `stalls`, `cuda`, ...;
    /// a summary lists those it has).
    pub sections: Option<Vec<String>>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct DiffArgs {
    /// The baseline: a recording, a JSON report, or a folder of them.
    pub base: String,
    /// The run to compare with it.
    pub new: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct CheckArgs {
    /// A recording or a JSON report.
    pub run: String,
    /// A TOML file of budgets (`idle = "15%"`, `dataloader_cpu = "5%"`, `busy = "80%"`,
    /// `lost_events = 0`).
    pub budget: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct DoctorArgs {
    /// Also check this process's CUDA setup.
    pub pid: Option<u32>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct PathArgs {
    /// A recording (.rec) or a JSON report.
    pub path: String,
}

fn text(s: impl Into<String>) -> CallToolResult {
    CallToolResult::success(vec![ContentBlock::text(s)])
}

fn failed(s: impl Into<String>) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(s)])
}

fn json(v: &impl serde::Serialize) -> CallToolResult {
    match serde_json::to_string_pretty(v) {
        Ok(s) => text(s),
        Err(e) => failed(format!("the result does not serialize: {e}")),
    }
}

/// A gate's result: its exit status in words, and what it printed.
fn gate(code: i32, meaning: &str, output: &str) -> CallToolResult {
    text(format!("exit status {code}: {meaning}\n\n{output}"))
}

type ToolResult = Result<CallToolResult, ErrorData>;

#[tool_router]
impl Server {
    fn new(args: McpArgs) -> anyhow::Result<Self> {
        Ok(Self {
            stallscope: std::sync::Arc::new(Stallscope::this()?),
            dir: args.dir,
            made_dir: Default::default(),
            nvml_lib: args.nvml_lib,
            tool_router: Self::tool_router(),
        })
    }

    fn nvml_args(&self) -> Vec<String> {
        self.nvml_lib
            .iter()
            .flat_map(|l| ["--nvml-lib".to_string(), l.display().to_string()])
            .collect()
    }

    /// The report of `path` as `stallscope report --format json` gives it.
    async fn report_doc(&self, path: &str) -> Result<ReportDoc, String> {
        let args = ["report", path, "--format", "json", "--no-flamegraphs"];
        let ran = self
            .stallscope
            .run(args.map(String::from).to_vec(), READ_LIMIT)
            .await
            .map_err(|e| format!("{e:#}"))?;
        if ran.code != 0 {
            return Err(ran.said());
        }
        read_report(ran.stdout.as_bytes(), path).map_err(|e| e.to_string())
    }

    /// Where `record` writes when not told: `--dir`, else a folder this server made, only the
    /// user can read.
    fn recording_path(&self, pid: u32) -> Result<PathBuf, String> {
        let dir = match &self.dir {
            Some(d) => d.clone(),
            None => {
                let mut made = self.made_dir.lock().map_err(|e| e.to_string())?;
                match &*made {
                    Some(d) => d.clone(),
                    None => {
                        let d = crate::owner::create_private_dir("stallscope-mcp")
                            .map_err(|e| format!("{e:#}"))?;
                        *made = Some(d.clone());
                        d
                    }
                }
            }
        };
        let ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0);
        Ok(dir.join(format!("pid{pid}-{ms}.rec")))
    }

    #[tool(
        description = "Record a running GPU training job for some seconds (root, as `sudo \
                       stallscope record`), then report why its GPU sat idle: the verdict, \
                       causes with their threads and code, advice. Returns the recording's path."
    )]
    async fn record(&self, Parameters(a): Parameters<RecordArgs>) -> ToolResult {
        if a.seconds == 0 || a.seconds > MAX_RECORD_SECS {
            return Ok(failed(format!(
                "seconds must be 1 to {MAX_RECORD_SECS}, not {}",
                a.seconds
            )));
        }
        let path = match a.output {
            Some(p) => PathBuf::from(p),
            None => match self.recording_path(a.pid) {
                Ok(p) => p,
                Err(e) => return Ok(failed(e)),
            },
        };
        let mut args: Vec<String> = vec![
            "record".into(),
            "--pid".into(),
            a.pid.to_string(),
            "-d".into(),
            format!("{}s", a.seconds),
            "-o".into(),
            path.display().to_string(),
            "--format".into(),
            "json".into(),
            "--no-flamegraphs".into(),
        ];
        args.extend(self.nvml_args());
        let limit = Duration::from_secs(a.seconds.into()) + RECORD_GRACE;
        let ran = match self.stallscope.run(args, limit).await {
            Ok(r) => r,
            Err(e) => return Ok(failed(format!("{e:#}"))),
        };
        if ran.code != 0 {
            return Ok(failed(ran.said()));
        }
        let recording = path.display().to_string();
        Ok(match read_report(ran.stdout.as_bytes(), &recording) {
            Ok(doc) => json(&serde_json::json!({
                "recording": recording,
                "summary": Compact::of(&doc),
            })),
            Err(e) => failed(e.to_string()),
        })
    }

    #[tool(
        description = "Report a recording (or JSON report): by default a compact summary (the \
                       verdict, each GPU's busy/waiting/idle split, causes with the thread and \
                       code behind them, steps, what-if estimates, advice); `sections` gives \
                       parts of the report whole; `format` text, markdown or json gives the \
                       full report."
    )]
    async fn report(&self, Parameters(a): Parameters<ReportArgs>) -> ToolResult {
        let format = a.format.as_deref().unwrap_or("summary");
        match format {
            "summary" => {}
            "text" | "markdown" | "json" => {
                let args = ["report", &a.path, "--format", format, "--no-flamegraphs"];
                let ran = match self
                    .stallscope
                    .run(args.map(String::from).to_vec(), READ_LIMIT)
                    .await
                {
                    Ok(r) => r,
                    Err(e) => return Ok(failed(format!("{e:#}"))),
                };
                return Ok(if ran.code == 0 {
                    text(ran.stdout)
                } else {
                    failed(ran.said())
                });
            }
            other => {
                return Ok(failed(format!(
                    "format {other:?}: summary, text, markdown or json"
                )));
            }
        }
        let doc = match self.report_doc(&a.path).await {
            Ok(d) => d,
            Err(e) => return Ok(failed(e)),
        };
        let Some(names) = a.sections.filter(|s| !s.is_empty()) else {
            return Ok(json(&Compact::of(&doc)));
        };
        let mut parts = serde_json::Map::new();
        for name in names {
            match compact::section(&doc, &name) {
                Ok(v) => {
                    parts.insert(name, v);
                }
                Err(e) => return Ok(failed(e)),
            }
        }
        Ok(json(&parts))
    }

    #[tool(
        description = "Compare a run with a baseline (`stallscope diff`): exit status 1 when a \
                       cause's share of GPU time rose past its threshold, with the table."
    )]
    async fn diff(&self, Parameters(a): Parameters<DiffArgs>) -> ToolResult {
        let args = [
            "diff",
            &a.base,
            &a.new,
            "--format",
            "markdown",
            "--no-flamegraphs",
        ];
        self.gate(
            args.map(String::from).to_vec(),
            "no cause rose",
            "a cause rose",
        )
        .await
    }

    #[tool(
        description = "Hold a run to budgets from a TOML file (`stallscope check`): exit status \
                       1 when one is exceeded, with which."
    )]
    async fn check(&self, Parameters(a): Parameters<CheckArgs>) -> ToolResult {
        let args = [
            "check", &a.run, "--budget", &a.budget, "--format", "markdown",
        ];
        self.gate(
            args.map(String::from).to_vec(),
            "every budget held",
            "a budget was exceeded",
        )
        .await
    }

    async fn gate(&self, args: Vec<String>, passed: &str, regressed: &str) -> ToolResult {
        Ok(match self.stallscope.run(args, READ_LIMIT).await {
            Ok(r) if r.code == 0 => gate(0, passed, &r.stdout),
            Ok(r) if r.code == 1 => gate(1, regressed, &r.stdout),
            Ok(r) => failed(r.said()),
            Err(e) => failed(format!("{e:#}")),
        })
    }

    #[tool(
        description = "Check this host's GPUs the way the field guides do (`stallscope \
                       doctor`): driver, kernel log, ECC, PCIe, clocks and throttling, \
                       temperature, power, MIG, memory holders; with a pid, the job's CUDA setup."
    )]
    async fn doctor(&self, Parameters(a): Parameters<DoctorArgs>) -> ToolResult {
        let mut args: Vec<String> = vec!["doctor".into(), "--format".into(), "json".into()];
        if let Some(pid) = a.pid {
            args.extend(["--pid".into(), pid.to_string()]);
        }
        args.extend(self.nvml_args());
        Ok(match self.stallscope.run(args, READ_LIMIT).await {
            Ok(r) if r.code <= 2 && r.code >= 0 => {
                let meaning = ["every check passed", "a warning", "a failure"][r.code as usize];
                gate(r.code, meaning, &r.stdout)
            }
            Ok(r) => failed(r.said()),
            Err(e) => failed(format!("{e:#}")),
        })
    }

    #[tool(
        description = "The training steps of a recording per GPU: how many, the step time \
                       (p50/p90/p99) and where a step's time went, or why none was found."
    )]
    async fn steps(&self, Parameters(a): Parameters<PathArgs>) -> ToolResult {
        Ok(match self.report_doc(&a.path).await {
            Ok(doc) => json(
                &doc.gpus
                    .iter()
                    .map(|g| serde_json::json!({"gpu": g.index, "steps": g.steps}))
                    .collect::<Vec<_>>(),
            ),
            Err(e) => failed(e),
        })
    }

    #[tool(
        description = "What fixing each cause would do to the step time, per GPU: the step now \
                       and once fixed, the speedup with its 90% interval, and what would limit \
                       the step next."
    )]
    async fn what_if(&self, Parameters(a): Parameters<PathArgs>) -> ToolResult {
        Ok(match self.report_doc(&a.path).await {
            Ok(doc) => json(
                &doc.gpus
                    .iter()
                    .map(|g| serde_json::json!({"gpu": g.index, "what_if": g.what_if}))
                    .collect::<Vec<_>>(),
            ),
            Err(e) => failed(e),
        })
    }

    #[tool(
        description = "What to change, with numbers: each change, the settings it names \
                       (num_workers, ...), the expected speedup and the measurements behind it."
    )]
    async fn advice(&self, Parameters(a): Parameters<PathArgs>) -> ToolResult {
        Ok(match self.report_doc(&a.path).await {
            Ok(doc) => json(&doc.advice),
            Err(e) => failed(e),
        })
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Server {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("stallscope", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "stallscope explains why a GPU training job's GPU sits idle. `record` a \
                 running job by PID (needs root) or `report` a recording; the summary names \
                 the cause, the threads and code behind it, and the change to make.",
            )
    }
}
