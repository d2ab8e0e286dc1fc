//! lbctl: talks to lbd's API on its unix socket. It holds no logic of its own beyond formatting:
//! each command group reads its rows (`lb_userspace::status`) and prints them in one file here.
//!
//! Exit codes (docs/cli.md): 0 done; 1 lbd answered with an error (the command was refused) or
//! a local command failed; 2 usage error; 3 lbd not reachable (no socket, no answer in time).

mod backends;
mod bgp;
mod explain;
mod flows;
mod output;
mod render;
mod stats;
mod trace;
mod vips;
mod vrrp;

use std::{io::IsTerminal, path::PathBuf, process::ExitCode};

use anyhow::Result;
use clap::{CommandFactory, Parser, Subcommand, ValueEnum};
use lb_userspace::{
    api::{CallError, Client},
    status::VersionRow,
};
use output::{Output, parse_duration};
use serde::Serialize;

/// Exit code when lbd cannot be asked at all.
const EXIT_UNREACHABLE: u8 = 3;
/// Exit code when lbd answered no (or a local command failed).
const EXIT_REFUSED: u8 = 1;

#[derive(Parser, Clone)]
#[command(
    name = "lbctl",
    version,
    about = "Inspect and steer lbd, the XDP load balancer",
    after_help = "Exit codes: 0 done, 1 refused by lbd (or a local command failed), 2 usage, 3 lbd not reachable."
)]
struct Cli {
    /// lbd's API socket.
    #[arg(
        long,
        global = true,
        env = "LBD_SOCKET",
        default_value = "/run/lbd/lbd.sock"
    )]
    socket: PathBuf,
    /// Output format: table, wide (every column), json or yaml (the API's documents, docs/api.md).
    #[arg(long, short, global = true, value_enum, default_value = "table")]
    output: Output,
    /// Run the command again every interval (default 2s) until interrupted, like watch(1).
    /// json and yaml print one document per round, without terminal codes.
    #[arg(long, global = true, num_args = 0..=1, default_missing_value = "2s", value_parser = parse_duration)]
    watch: Option<std::time::Duration>,
    /// Give up when lbd does not answer within this time (e.g. 500ms, 5s).
    #[arg(long, global = true, default_value = "5s", value_parser = parse_duration)]
    timeout: std::time::Duration,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Clone)]
enum Cmd {
    /// Backends per VIP service: state, MAC, weight, traffic.
    #[command(subcommand)]
    Backends(backends::Cmd),
    /// VIP services: ownership and traffic.
    #[command(subcommand)]
    Vips(vips::Cmd),
    /// VRRP instances: state, priorities, master, counters, collisions.
    #[command(subcommand)]
    Vrrp(vrrp::Cmd),
    /// BGP announcements (VIPs with announce = "bgp"): sessions, prefixes, node drain.
    #[command(subcommand)]
    Bgp(bgp::Cmd),
    /// Data-plane counters per verdict and reason, connection-table use.
    Stats,
    /// Connection-table and flow-cache entries (client, VIP, backend, pair epoch), optionally
    /// of one VIP[:PORT] or client; read from the maps while forwarding continues.
    Flows(flows::Args),
    /// Where one packet of a flow goes now and why (entry, Maglev slot, skipped backend, owner,
    /// loop guard), decided by the running XDP program in a dry run that writes nothing.
    Explain(explain::Args),
    /// A live sample of the data plane's decisions (client, VIP, verdict, reason, backend),
    /// optionally of one VIP[:PORT]; the XDP program records them only while a trace runs.
    Trace(trace::Args),
    /// Make lbd re-read its config; an invalid config is refused and the running one kept.
    Reload,
    /// This lbctl's version and the running lbd's.
    Version,
    /// The API and ingress VRIDs OpenShift derives from a cluster name.
    VrIds {
        /// Cluster name (as in install-config's metadata.name).
        cluster_name: String,
    },
    /// Write every node's lbd.toml (DIR/<node>.toml) from one cluster description: OpenShift's
    /// VRIDs, priorities and tracked checks, unicast peers. Validated like lbd's config; nothing
    /// is written unless every node's config is valid. No lbd needed.
    Render(render::Args),
    /// Exit 0 if lbd is live (main loop running) or ready (data plane attached, config
    /// applied), else non-zero: for the pod's probes.
    Probe {
        #[arg(value_enum)]
        what: ProbeKind,
    },
    /// Print shell completions.
    Completions { shell: clap_complete::Shell },
}

#[derive(Clone, Copy, ValueEnum)]
enum ProbeKind {
    Live,
    Ready,
}

/// What every command gets: the client and the output format.
pub struct Ctx {
    pub client: Client,
    pub out: Output,
}

impl Ctx {
    /// Print `v` as a document when the format is json or yaml; else `text(v)`.
    pub fn show<T: Serialize>(&self, v: &T, text: impl FnOnce(&T)) -> Result<()> {
        if self.out.structured() {
            output::document(self.out, v)
        } else {
            text(v);
            Ok(())
        }
    }
}

#[derive(Serialize)]
struct Versions {
    client: VersionRow,
    /// None when lbd could not be asked (the error says why).
    daemon: Option<VersionRow>,
    daemon_error: Option<String>,
}

async fn run(cli: Cli) -> Result<()> {
    let Some(every) = cli.watch else {
        return run_once(cli).await;
    };
    // Terminal codes only for a person watching a terminal: json and yaml stay parseable
    // documents, one per round (YAML separated by `---`).
    let clear = !cli.output.structured() && std::io::stdout().is_terminal();
    loop {
        if clear {
            print!("\x1b[H\x1b[2J");
        }
        match cli.output {
            Output::Yaml => println!("---"),
            Output::Json => {}
            _ => println!(
                "every {every:?}: lbctl {}\n",
                std::env::args().skip(1).collect::<Vec<_>>().join(" ")
            ),
        }
        if let Err(e) = run_once(cli.clone()).await {
            // Errors go to stderr so that stdout stays a stream of documents.
            eprintln!("lbctl: {e:#}");
        }
        tokio::time::sleep(every).await;
    }
}

async fn run_once(cli: Cli) -> Result<()> {
    let ctx = Ctx {
        client: Client::new(&cli.socket).with_timeout(cli.timeout),
        out: cli.output,
    };
    match cli.command {
        Cmd::Backends(cmd) => backends::run(&ctx, cmd).await,
        Cmd::Vips(cmd) => vips::run(&ctx, cmd).await,
        Cmd::Vrrp(cmd) => vrrp::run(&ctx, cmd).await,
        Cmd::Bgp(cmd) => bgp::run(&ctx, cmd).await,
        Cmd::Stats => stats::run(&ctx).await,
        Cmd::Flows(a) => flows::run(&ctx, a).await,
        Cmd::Explain(a) => explain::run(&ctx, a).await,
        Cmd::Trace(a) => {
            // The call lasts as long as the trace waits.
            let ctx = Ctx {
                client: Client::new(&cli.socket).with_timeout(cli.timeout + a.wait),
                out: cli.output,
            };
            trace::run(&ctx, a).await
        }
        Cmd::Reload => {
            let v: serde_json::Value = ctx.client.post("/v1/reload", None).await?;
            ctx.show(&v, |_| println!("reloaded"))
        }
        Cmd::Version => {
            let daemon = ctx.client.get::<VersionRow>("/v1/version").await;
            let v = Versions {
                client: VersionRow::this(),
                daemon: daemon.as_ref().ok().cloned(),
                daemon_error: daemon.as_ref().err().map(|e| format!("{e}")),
            };
            ctx.show(&v, |v| {
                let line = |r: &VersionRow| match &r.commit {
                    Some(c) => format!("{} ({c})", r.version),
                    None => r.version.clone(),
                };
                println!("lbctl {}", line(&v.client));
                if let Some(d) = &v.daemon {
                    println!("lbd   {}", line(d));
                }
            })?;
            // The client's version is printed either way; the exit code says whether lbd
            // answered.
            daemon.map(|_| ()).map_err(Into::into)
        }
        Cmd::VrIds { cluster_name } => render::vr_ids(&ctx, cluster_name),
        Cmd::Render(args) => render::run(&ctx, args),
        Cmd::Probe { what } => {
            let path = match what {
                ProbeKind::Live => "/healthz",
                ProbeKind::Ready => "/readyz",
            };
            print!("{}", ctx.client.text(hyper::Method::GET, path, None).await?);
            Ok(())
        }
        Cmd::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "lbctl", &mut std::io::stdout());
            Ok(())
        }
    }
}

/// The exit code for an error: 3 when lbd could not be asked, 1 otherwise.
fn exit_code(e: &anyhow::Error) -> u8 {
    match e.downcast_ref::<CallError>() {
        Some(c) if c.unreachable() => EXIT_UNREACHABLE,
        _ => EXIT_REFUSED,
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("lbctl: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lbctl: {e:#}");
            ExitCode::from(exit_code(&e))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unreachable_and_refused_exit_differently() {
        let unreachable: anyhow::Error = CallError::Unreachable {
            socket: "/x".into(),
            error: std::io::Error::from(std::io::ErrorKind::NotFound),
        }
        .into();
        assert_eq!(exit_code(&unreachable), EXIT_UNREACHABLE);
        let refused: anyhow::Error = CallError::Refused {
            status: 422,
            reason: "Unprocessable Entity",
            message: "bad".into(),
        }
        .into();
        assert_eq!(exit_code(&refused), EXIT_REFUSED);
        assert_eq!(exit_code(&anyhow::anyhow!("render failed")), EXIT_REFUSED);
    }

    #[test]
    fn the_cli_is_consistent() {
        Cli::command().debug_assert();
    }
}
