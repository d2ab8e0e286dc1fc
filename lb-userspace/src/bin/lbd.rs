//! lbd: the load-balancer daemon. See `lbd --help`.
use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "lbd",
    version,
    about = "XDP load balancer daemon with a VRRP speaker"
)]
struct Cli {
    /// Config file (TOML); see docs/config.md.
    #[arg(long, short, default_value = "/etc/lb/lbd.toml")]
    config: PathBuf,
    /// Log format.
    #[arg(long, value_enum, default_value = "human")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Human,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run the daemon (the default).
    Run,
    /// Check the config and exit: 0 if valid, else the error naming the field.
    Check,
    /// Undo everything lbd added (run with lbd stopped): detach the XDP program and remove its
    /// pins, remove the VIPs from the interface and `lo`, put the ARP sysctls back.
    Teardown,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_env("LB_LOG")
        // netlink-packet-route warns on every link dump about attributes newer kernels add.
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,netlink_packet_route=error"));
    match cli.log_format {
        LogFormat::Human => tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .init(),
        LogFormat::Json => tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .init(),
    }
    let result = match cli.command.unwrap_or(Command::Run) {
        Command::Check => lb_userspace::config::Config::load(&cli.config)
            .map(|_| {
                println!("{}: ok", cli.config.display());
            })
            .map_err(anyhow::Error::from),
        Command::Teardown => lb_userspace::config::Config::load(&cli.config)
            .map_err(anyhow::Error::from)
            .and_then(|cfg| {
                tokio::runtime::Runtime::new()?.block_on(lb_userspace::daemon::teardown(&cfg))
            }),
        Command::Run => tokio::runtime::Runtime::new()
            .map_err(anyhow::Error::from)
            .and_then(|rt| rt.block_on(lb_userspace::daemon::run(cli.config.clone()))),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lbd: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
