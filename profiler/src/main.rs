//! stallscope: attaches to a training job's process tree and explains where its time goes.
mod btf;
mod cli;
mod elf;
mod events;
mod files;
mod gpu;
mod launch;
mod launch_window;
mod loader;
mod offsets;
mod output;
mod owner;
mod privileges;
mod record;
mod recording_file;
mod session;
mod slots;
mod symbolize;
mod target;
mod tracefs;
mod uprobes;

use clap::Parser as _;

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = cli::Cli::parse();
    let result = match cli.command {
        cli::Command::Record(args) => record::run(args),
        cli::Command::Report(args) => output::render_many(&args.files, &args.out).map(|()| 0),
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("stallscope: error: {e:#}");
            std::process::exit(1);
        }
    }
}
