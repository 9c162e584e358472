//! The `tessera` command line: `up`/`down`/`status` of the embedded local
//! cluster, `serve` (the coordinator process), `rebalance` and `load`.

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
    /// Create (first time) or start a local cluster: coordinator database, workers and coordinator;
    /// with more --workers than a running cluster has, add workers to it.
    Up {
        #[arg(long, default_value = "./tessera-data")]
        data_dir: PathBuf,
        /// Port the coordinator accepts PostgreSQL clients on.
        #[arg(long, default_value_t = 5432)]
        port: u16,
        #[arg(long, default_value_t = 2)]
        workers: usize,
        /// Connections per worker one read outside a transaction block runs
        /// its shard tasks on at most (1: one after another); written to the
        /// configuration. Default: this machine's CPUs.
        #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
        max_adaptive_executor_pool_size: Option<usize>,
        /// Give every worker and the coordinator database a synchronous
        /// streaming standby (0 or 1), which the coordinator promotes when
        /// the primary stops answering; a former primary becomes its
        /// successor's standby again.
        #[arg(long, default_value_t = 0)]
        standbys: usize,
    },
    /// Stop the local cluster.
    Down {
        #[arg(long, default_value = "./tessera-data")]
        data_dir: PathBuf,
    },
    /// Move shards so that every worker holds its share (after `up --workers N`
    /// added some), with progress: moves, megabytes, time left.
    Rebalance {
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
    /// Bulk-load files into a distributed or reference table, straight to the
    /// workers: rows are hashed here and streamed per shard with COPY.
    Load {
        /// Input files, glob patterns, or - for standard input (.gz and .zst are decompressed).
        #[arg(required = true)]
        inputs: Vec<String>,
        #[arg(long)]
        table: String,
        /// csv or text.
        #[arg(long, default_value = "csv")]
        format: String,
        /// The first line of each input is a header.
        #[arg(long)]
        header: bool,
        /// Field delimiter (default: , for csv, tab for text).
        #[arg(long)]
        delimiter: Option<char>,
        /// Parallel readers.
        #[arg(long, default_value_t = 4)]
        jobs: usize,
        /// Write bad rows here (input:line, reason, row) and load the rest;
        /// without it the load is all or nothing.
        #[arg(long)]
        reject_file: Option<PathBuf>,
        /// Rows per COPY batch sent to a shard (a batch also goes out once it
        /// holds 256 kB).
        #[arg(long, default_value_t = 10000)]
        batch_size: usize,
        /// The coordinator to read the catalog from.
        #[arg(long, default_value = "127.0.0.1")]
        host: String,
        #[arg(long, default_value_t = 5432)]
        port: u16,
        #[arg(long, default_value = "postgres")]
        user: String,
        #[arg(long, default_value = "postgres")]
        dbname: String,
        /// Send rows zstd-compressed; the workers decompress them with a
        /// `tessera receive` they start themselves (COPY … FROM PROGRAM).
        #[arg(long, value_parser = ["zstd"])]
        compress: Option<String>,
        /// The coordinator's configuration file: the loader reaches the
        /// workers as the coordinator does (their Unix sockets on this host,
        /// else TLS with the certificates of the cluster's CA). Default:
        /// ./tessera-data/tessera.toml, when there is one.
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Internal: run by a worker's COPY … FROM PROGRAM during `tessera load --compress zstd`.
    #[command(hide = true)]
    Receive {
        #[arg(long)]
        connect: String,
        #[arg(long)]
        token: String,
    },
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::try_from_env("TESSERA_LOG").unwrap_or_else(|_| "info".into())).init();
    let cli = Cli::parse();
    match cli.command {
        Command::Up { data_dir, port, workers, max_adaptive_executor_pool_size, standbys } => {
            let mut cluster = tessera::cluster::up(&data_dir, port, workers, max_adaptive_executor_pool_size, &std::env::current_exe()?)?;
            tessera::cluster::standbys::ensure(&mut cluster, standbys)?;
            // A data directory made before keeps the port it was made with.
            let port = cluster.state.coordinator_port;
            println!(
                "Tessera is running: coordinator on 127.0.0.1:{port}, {} workers, data in {}",
                cluster.state.worker_ports.len(),
                cluster.dir.display()
            );
            println!("Connect with:  psql -h 127.0.0.1 -p {port} -U postgres postgres");
            if let Some(listen) = tessera::config::Config::load(&cluster.config_path())?.metrics_listen {
                println!("Dashboard:     http://{listen}/   (Prometheus metrics at /metrics)");
            }
            Ok(())
        }
        Command::Down { data_dir } => tessera::cluster::down(&data_dir),
        Command::Rebalance { data_dir } => runtime()?.block_on(tessera::cluster::rebalance(&data_dir)),
        Command::Status { data_dir, format } => runtime()?.block_on(tessera::cluster::status(&data_dir, format == "env")),
        Command::Serve { config } => {
            let config = tessera::config::Config::load(&config)?;
            runtime()?.block_on(tessera::server::serve(config))
        }
        Command::Load { inputs, table, format, header, delimiter, jobs, reject_file, batch_size, host, port, user, dbname, compress, config } => {
            let embedded = PathBuf::from("./tessera-data/tessera.toml");
            if let Some(path) = config.or_else(|| embedded.exists().then_some(embedded)) {
                tessera::connection::node_tls::reach_nodes_as_configured(&tessera::config::Config::load(&path)?)?;
            }
            let format = match format.as_str() {
                "csv" => tessera::copy::Format::Csv,
                "text" => tessera::copy::Format::Text,
                other => anyhow::bail!("unknown --format {other}: use csv or text"),
            };
            let delimiter =
                delimiter.map(|d| u8::try_from(d).map_err(|_| anyhow::anyhow!("the delimiter must be a single-byte character"))).transpose()?;
            let options = tessera::load::LoadOptions {
                inputs,
                table: table.clone(),
                format,
                header,
                delimiter,
                jobs,
                reject_file,
                batch_rows: batch_size.max(1),
                compress: compress.is_some(),
                coordinator: tessera::config::ServerAddr { host, port },
                user,
                database: dbname,
            };
            let summary = runtime()?.block_on(tessera::load::run(options))?;
            println!("{}", summary.line(&table));
            Ok(())
        }
        Command::Receive { connect, token } => tessera::load::receive(&connect, &token),
    }
}

fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build()
}
