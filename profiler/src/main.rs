//! stallscope: attaches to a training job's process tree and explains where its time goes.
mod capture;
mod cli;
mod output;
mod owner;
mod privileges;
mod recorder;
mod spawn;

use clap::Parser as _;

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = cli::Cli::parse();
    let result = match cli.command {
        cli::Command::Record(args) => recorder::run(args),
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
