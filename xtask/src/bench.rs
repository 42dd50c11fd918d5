//! Benchmarks (placeholder until the overhead benchmark lands).
#[derive(clap::Args)]
pub struct BenchArgs {
    /// Which benchmark: overhead.
    pub which: String,
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    anyhow::bail!("unknown benchmark `{}`", args.which)
}
