//! lbd: the load-balancer daemon. See `lbd --help`.
use std::path::PathBuf;

use clap::{Parser, Subcommand};
use lb_userspace::config::ConfigFile;

#[derive(Parser)]
#[command(
    name = "lbd",
    version,
    about = "XDP load balancer daemon with a VRRP speaker"
)]
struct Cli {
    /// Config file (TOML); see docs/config.md. A directory of configs rendered by `lbctl render`
    /// (what a MachineConfig ships to every node of a pool): lbd runs the one whose VRRP
    /// `unicast_src` is an address of this host.
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
    /// Internal: the VIP guardian `lbd run` starts (see lb_userspace::guardian).
    #[command(hide = true)]
    Guardian,
    /// Run on a backend that routed LB nodes reach by IP-in-IP (backends with
    /// `encap = "ipip"`): unwrap their packets on INTERFACE with XDP and serve the VIPs from
    /// `lo`, until SIGTERM. Needs no config file.
    Decap {
        /// The interface the wrapped packets arrive on.
        #[arg(long)]
        interface: String,
        /// An LB node's address that may send wrapped packets (repeat for each node);
        /// IP-in-IP from any other source is left to the kernel, which drops it.
        #[arg(long = "lb-node", required = true)]
        lb_nodes: Vec<std::net::IpAddr>,
        /// A VIP to serve (repeat): held on `lo`, never answered for in ARP/ND. Only wrapped
        /// packets for these VIPs (sent to one of this host's addresses) are unwrapped; an LB
        /// node's packet for anything else is dropped.
        #[arg(long = "vip", required = true)]
        vips: Vec<std::net::IpAddr>,
        #[arg(long, value_enum, default_value = "auto")]
        xdp_mode: XdpModeArg,
        /// Names its BPF pins (`/sys/fs/bpf/<name>-decap`).
        #[arg(long, default_value = "lb")]
        name: String,
        /// A TCP port answered while unwrapping: lbd's health check of this backend connects
        /// to it first (the backend's `decap_health_port`); 0 for none.
        #[arg(long, default_value_t = lb_userspace::config::DEFAULT_DECAP_HEALTH_PORT)]
        health_port: u16,
        /// Where the ARP sysctls found at start are kept until the stop puts them back.
        #[arg(long, default_value = "/run/lbd")]
        state_dir: std::path::PathBuf,
    },
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum XdpModeArg {
    Auto,
    Driver,
    Skb,
}

/// Info, except one target: netlink-packet-route 0.25 (the newest that rtnetlink 0.18 takes)
/// warns on every link dump of a kernel whose IFLA_INET6_CONF grew past what it knows ("expecting
/// 236, got 240" on 6.x). The extra bytes are IPv6 sysctls we never read, so the warning is
/// noise that reads as trouble; errors from that module still show. LB_LOG, else RUST_LOG,
/// overrides it all.
const DEFAULT_LOG_FILTER: &str = "info,netlink_packet_route::link::buffer_tool=error";

/// The log filter: `LB_LOG`, else the Rust ecosystem's `RUST_LOG`, else the default. A filter
/// that does not parse is reported and the default used (lbd still starts and logs).
fn log_filter() -> (tracing_subscriber::EnvFilter, Option<String>) {
    for var in ["LB_LOG", "RUST_LOG"] {
        if let Ok(text) = std::env::var(var) {
            return match tracing_subscriber::EnvFilter::try_new(&text) {
                Ok(f) => (f, None),
                Err(e) => (
                    tracing_subscriber::EnvFilter::new(DEFAULT_LOG_FILTER),
                    Some(format!("{var}={text:?}: {e}; using {DEFAULT_LOG_FILTER:?}")),
                ),
            };
        }
    }
    (tracing_subscriber::EnvFilter::new(DEFAULT_LOG_FILTER), None)
}

fn main() -> std::process::ExitCode {
    let mut cli = Cli::parse();
    let (filter, bad_filter) = log_filter();
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
    if let Some(why) = bad_filter {
        tracing::warn!("log filter refused: {why}");
    }
    // From here on fatal errors go through the logger, so that a JSON log stays JSON.
    let interactive = matches!(cli.command, Some(Command::Check | Command::Teardown));
    let fatal = |e: &anyhow::Error| {
        if interactive {
            eprintln!("lbd: {e:#}");
        } else {
            tracing::error!(error = %format!("{e:#}"), "lbd stopped on an error");
        }
        std::process::ExitCode::FAILURE
    };
    // A directory of rendered configs without this node's: `lbd run` waits for it (up, not
    // ready, saying why) instead of exiting into a crash loop.
    let mut waiting_for_config = None;
    match lb_userspace::config::node::node_config_path(&cli.config) {
        Ok(p) => cli.config = p,
        Err(e) if cli.config.is_dir() && matches!(cli.command, None | Some(Command::Run)) => {
            waiting_for_config = Some(e.to_string());
        }
        Err(e) => return fatal(&anyhow::anyhow!("{e}")),
    }
    // A container's PID 1: the VIP guardian runs the daemon as its child (see guardian::init).
    if std::process::id() == 1 && matches!(cli.command, None | Some(Command::Run)) {
        return lb_userspace::guardian::init();
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
        Command::Guardian => lb_userspace::guardian::serve(),
        Command::Decap {
            interface,
            lb_nodes,
            vips,
            xdp_mode,
            name,
            health_port,
            state_dir,
        } => {
            use lb_userspace::config::XdpMode;
            let o = lb_userspace::decap::DecapOptions {
                name,
                interface,
                lb_nodes,
                vips,
                mode: match xdp_mode {
                    XdpModeArg::Auto => XdpMode::Auto,
                    XdpModeArg::Driver => XdpMode::Driver,
                    XdpModeArg::Skb => XdpMode::Skb,
                },
                health_port,
                state_dir,
            };
            tokio::runtime::Runtime::new()
                .map_err(anyhow::Error::from)
                .and_then(|rt| rt.block_on(lb_userspace::decap::serve(o)))
        }
        Command::Run => tokio::runtime::Runtime::new()
            .map_err(anyhow::Error::from)
            .and_then(|rt| {
                rt.block_on(async {
                    // First: a stop signal from here on is lbd's to handle, not a kill.
                    let mut signals = lb_userspace::daemon::Signals::register()?;
                    let config = match waiting_for_config {
                        Some(why) => tokio::select! {
                            p = lb_userspace::config_watch::wait_for_node_config(
                                cli.config.clone(),
                                why,
                            ) => p,
                            _ = signals.stop() => {
                                tracing::info!("stopped while waiting for this node's config");
                                return Ok(());
                            }
                        },
                        None => cli.config.clone(),
                    };
                    lb_userspace::daemon::run(config, signals).await
                })
            }),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => fatal(&e),
    }
}
