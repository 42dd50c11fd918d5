//! The CI recipes in `examples/ci/` run as written: each file is parsed as YAML, and the
//! shell its steps hold runs against stallgen on the simulated GPU, with `BENCH_CMD` the
//! benchmark. What only GitHub or GitLab provide is stood in for: the artifact store (the
//! baseline is copied), `gh` and `curl` (shims that record their arguments and serve the
//! baseline), `sudo` (this test is root). A healthy benchmark against a healthy baseline
//! passes; a benchmark with a slow DataLoader transform fails and names `dataloader_cpu`.
#[allow(
    dead_code,
    reason = "each test binary uses its own part of the shared helpers"
)]
mod common;

use std::{
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::Command,
};

use common::{Scratch, serial, stallscope::bin};
use yaml_rust2::{Yaml, YamlLoader};

fn example(name: &str) -> Yaml {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/ci")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut docs =
        YamlLoader::load_from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(docs.len(), 1, "{}", path.display());
    docs.remove(0)
}

/// The simulated GPU, tools on PATH and the benchmark, for running a recipe's shell.
struct Bench {
    dir: Scratch,
    libs: PathBuf,
    state: PathBuf,
    path: String,
}

impl Bench {
    fn new(name: &str) -> Self {
        let dir = Scratch::new(name);
        let release = bin().parent().expect("a directory").to_path_buf();
        let libs = dir.join("lib");
        simgpu_state::install_dir(&release, &libs).expect("the simulated GPU is built");
        let tools = dir.join("bin");
        std::fs::create_dir_all(&tools).unwrap();
        std::os::unix::fs::symlink(bin(), tools.join("stallscope")).unwrap();
        std::os::unix::fs::symlink(release.join("stallgen"), tools.join("stallgen")).unwrap();
        let shim = |name: &str, body: &str| {
            let p = tools.join(name);
            std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        };
        shim("sudo", "exec \"$@\"");
        // gh and curl: their arguments go to a log; curl serves the kept baseline to -o/--output.
        shim("gh", "echo \"gh $*\" >> \"$SHIM_LOG\"");
        shim(
            "curl",
            "echo \"curl $*\" >> \"$SHIM_LOG\"\nout=\nwhile [ $# -gt 0 ]; do case $1 in -o|--output) out=$2; shift;; esac; shift; done\n[ -s \"$KEPT_BASELINE\" ] || exit 22\ncp \"$KEPT_BASELINE\" \"$out\"",
        );
        let path = format!(
            "{}:{}",
            tools.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let state = PathBuf::from(format!(
            "/dev/shm/stallscope-ci-{name}-{}",
            std::process::id()
        ));
        Bench {
            dir,
            libs,
            state,
            path,
        }
    }

    /// Runs `script` with bash in `workdir`, as a CI runner would, for a benchmark of
    /// `scenario`; returns its exit status and output.
    fn run(
        &self,
        workdir: &Path,
        script: &str,
        scenario: &str,
        env: &[(&str, String)],
    ) -> (i32, String) {
        std::fs::create_dir_all(workdir).unwrap();
        let out = Command::new("bash")
            .args(["-e", "-c", script])
            .current_dir(workdir)
            .env("PATH", &self.path)
            .env(
                "BENCH_CMD",
                format!("stallgen --scenario {scenario} --secs 30"),
            )
            .env("WARMUP_SECS", "3")
            .env("RECORD_SECS", "4")
            .env("LD_LIBRARY_PATH", &self.libs)
            .env("STALLSCOPE_SIMGPU_STATE", &self.state)
            .env("STALLSCOPE_NVML_LIB", self.libs.join("libnvidia-ml.so.1"))
            .env("SHIM_LOG", self.dir.join("shims.log"))
            .env("KEPT_BASELINE", self.dir.join("kept/new.json"))
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .output()
            .expect("bash runs");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code().unwrap_or(-1), text)
    }

    /// Keeps `workdir/new.json` as the baseline artifact.
    fn keep(&self, workdir: &Path) {
        let kept = self.dir.join("kept");
        std::fs::create_dir_all(&kept).unwrap();
        std::fs::copy(workdir.join("new.json"), kept.join("new.json"))
            .expect("the run kept new.json");
    }
}

impl Drop for Bench {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.state);
    }
}

/// The `run:` of the step named `name`.
fn step<'a>(steps: &'a [Yaml], name: &str) -> &'a str {
    steps
        .iter()
        .find(|s| s["name"].as_str() == Some(name))
        .and_then(|s| s["run"].as_str())
        .unwrap_or_else(|| panic!("no step {name:?} with a run"))
}

#[test]
fn the_github_actions_workflow_gates_a_regression() {
    let _guard = serial();
    let wf = example("github-actions.yml");
    let job = &wf["jobs"]["gpu-idle"];
    let steps = job["steps"].as_vec().expect("steps");
    assert!(
        job["env"]["BENCH_CMD"].as_str().is_some(),
        "the benchmark is BENCH_CMD"
    );
    // Every shell step is one of these, so none goes untested.
    let runs: Vec<&str> = steps
        .iter()
        .filter_map(|s| s["name"].as_str().filter(|_| !s["run"].is_badvalue()))
        .collect();
    assert_eq!(
        runs,
        [
            "Record the benchmark",
            "Compare with the baseline",
            "Post the comparison"
        ]
    );
    let (record, compare, post) = (
        step(steps, "Record the benchmark"),
        step(steps, "Compare with the baseline"),
        step(steps, "Post the comparison"),
    );
    let b = Bench::new("ci-github");
    // main: record, keep the report.
    let main = b.dir.join("main");
    let (code, out) = b.run(&main, record, "healthy", &[]);
    assert_eq!(code, 0, "{out}");
    b.keep(&main);
    // A pull request like main, then one with a slow transform.
    for (scenario, want) in [("healthy", 0), ("dataloader-cpu", 1)] {
        let pr = b.dir.join(&format!("pr-{scenario}"));
        std::fs::create_dir_all(pr.join("baseline")).unwrap();
        std::fs::copy(b.dir.join("kept/new.json"), pr.join("baseline/new.json")).unwrap();
        let (code, out) = b.run(&pr, record, scenario, &[]);
        assert_eq!(code, 0, "{scenario}: {out}");
        let summary = pr.join("summary.md");
        let env = [
            ("GITHUB_STEP_SUMMARY", summary.display().to_string()),
            ("GITHUB_OUTPUT", pr.join("output").display().to_string()),
        ];
        let (code, out) = b.run(&pr, compare, scenario, &env);
        assert_eq!(code, want, "{scenario}: {out}");
        let summary = std::fs::read_to_string(&summary).unwrap();
        eprintln!("{scenario}:\n{summary}");
        assert!(summary.starts_with("### stallscope diff:"), "{summary}");
        assert_eq!(
            summary.contains("`dataloader_cpu` | ") && summary.contains("**REGRESSION**"),
            want == 1,
            "{scenario}: {summary}"
        );
        let output = std::fs::read_to_string(pr.join("output")).unwrap();
        assert!(output.contains(&format!("status={want}")), "{output}");
        let env = [("PR", "7".to_owned()), ("GH_TOKEN", "x".to_owned())];
        let (code, out) = b.run(&pr, post, scenario, &env);
        assert_eq!(code, 0, "{out}");
    }
    let log = std::fs::read_to_string(b.dir.join("shims.log")).unwrap();
    assert_eq!(
        log.matches("gh pr comment 7 --body-file diff.md").count(),
        2,
        "{log}"
    );
}

#[test]
fn the_gitlab_job_gates_a_regression() {
    let _guard = serial();
    let ci = example("gitlab-ci.yml");
    let job = &ci["gpu-regression"];
    assert!(job["variables"]["BENCH_CMD"].as_str().is_some());
    let script: Vec<&str> = job["script"]
        .as_vec()
        .expect("a script")
        .iter()
        .map(|l| l.as_str().expect("script lines are strings"))
        .collect();
    let script = script.join("\n");
    let b = Bench::new("ci-gitlab");
    let gitlab = |branch: &str| {
        [
            ("CI_COMMIT_BRANCH", branch.to_owned()),
            ("CI_DEFAULT_BRANCH", "main".to_owned()),
            ("CI_JOB_TOKEN", "x".to_owned()),
            ("CI_API_V4_URL", "https://gitlab.example/api/v4".to_owned()),
            ("CI_PROJECT_ID", "1".to_owned()),
            ("CI_JOB_NAME", "gpu-regression".to_owned()),
        ]
    };
    // GitLab runs the script under bash with -e and pipefail.
    let script = format!("set -o pipefail\n{script}");
    let main = b.dir.join("main");
    let (code, out) = b.run(&main, &script, "healthy", &gitlab("main"));
    assert_eq!(code, 0, "{out}");
    assert!(
        !main.join("diff.md").exists(),
        "main is the baseline, not compared"
    );
    b.keep(&main);
    for (scenario, want) in [("healthy", 0), ("dataloader-cpu", 1)] {
        let work = b.dir.join(&format!("mr-{scenario}"));
        let (code, out) = b.run(&work, &script, scenario, &gitlab("feature"));
        assert_eq!(code, want, "{scenario}: {out}");
        let diff = std::fs::read_to_string(work.join("diff.md")).unwrap();
        assert_eq!(
            diff.contains("**REGRESSION**"),
            want == 1,
            "{scenario}: {diff}"
        );
        assert!(
            out.contains("### stallscope diff:"),
            "the job log shows it: {out}"
        );
    }
    let log = std::fs::read_to_string(b.dir.join("shims.log")).unwrap();
    assert!(
        log.contains("jobs/artifacts/main/raw/new.json?job=gpu-regression"),
        "{log}"
    );
}
