use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser)]
#[command(name = "tessera", version, about = "A distributed PostgreSQL: one coordinator over many stock PostgreSQL workers")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create (first time) or start a local cluster: coordinator database, workers and coordinator.
    Up {
        #[arg(long, default_value = "./tessera-data")]
        data_dir: PathBuf,
        /// Port the coordinator accepts PostgreSQL clients on.
        #[arg(long, default_value_t = 5432)]
        port: u16,
        #[arg(long, default_value_t = 2)]
        workers: usize,
    },
    /// Stop the local cluster.
    Down {
        #[arg(long, default_value = "./tessera-data")]
        data_dir: PathBuf,
    },
    /// Show the local cluster's nodes and shard placements.
    Status {
        #[arg(long, default_value = "./tessera-data")]
        data_dir: PathBuf,
        /// "text" (default) or "env" (shell variable assignments).
        #[arg(long, default_value = "text")]
        format: String,
    },
    /// Run only the coordinator process, against the servers a config file names.
    Serve {
        #[arg(long)]
        config: PathBuf,
    },
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::try_from_env("TESSERA_LOG").unwrap_or_else(|_| "info".into())).init();
    let cli = Cli::parse();
    match cli.command {
        Command::Up { data_dir, port, workers } => {
            let cluster = tessera::cluster::up(&data_dir, port, workers, &std::env::current_exe()?)?;
            println!("Tessera is running: coordinator on 127.0.0.1:{port}, {} workers, data in {}", cluster.state.worker_ports.len(), cluster.dir.display());
            println!("Connect with:  psql -h 127.0.0.1 -p {port} -U postgres postgres");
            Ok(())
        }
        Command::Down { data_dir } => tessera::cluster::down(&data_dir),
        Command::Status { data_dir, format } => runtime()?.block_on(tessera::cluster::status(&data_dir, format == "env")),
        Command::Serve { config } => {
            let config = tessera::config::Config::load(&config)?;
            runtime()?.block_on(tessera::server::serve(config))
        }
    }
}

fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build()
}
