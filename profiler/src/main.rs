//! stallscope: attaches to a training job's process tree and explains where its time goes.
mod agent;
mod capture;
mod cli;
mod doctor;
mod files;
mod gate;
mod install_files;
mod mcp;
mod nvml_reader;
mod output;
mod owner;
mod plan;
mod privileges;
mod recorder;
mod spawn;
mod sudo;
mod top;

use clap::Parser as _;

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = cli::Cli::parse();
    // diff and check promise 2 for every error, their 1 meaning a regression.
    let (result, error_code) = match cli.command {
        cli::Command::Record(args) => (recorder::run(&args.into()), 1),
        cli::Command::Report(args) => (
            output::render_many(&args.files, &args.out.into()).map(|()| 0),
            1,
        ),
        cli::Command::Diff(args) => (gate::run_diff(&args.into()), 2),
        cli::Command::Check(args) => (gate::run_check(&args.into()), 2),
        cli::Command::Doctor(args) => (doctor::run(&args.into()), 3),
        cli::Command::Top(args) => (top::run(&args.into()), 1),
        cli::Command::Mcp(args) => (mcp::run(args), 1),
        cli::Command::Agent(args) => (agent::run(&args.into()), 1),
        cli::Command::Completions(args) => (install_files::print_completions(args.shell), 1),
        cli::Command::Manpages(args) => (install_files::write_manpages(&args.dir), 1),
        cli::Command::Unprobe { fds } => (capture::handover::run_helper(&fds), 1),
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("stallscope: error: {e:#}");
            std::process::exit(error_code);
        }
    }
}
