//! Configuration of `tessera serve`: where to listen, the coordinator database,
//! and the workers to register at start-up. `tessera up` writes one of these for
//! the embedded cluster; multi-host clusters write their own.

use crate::connection::{Login, ServerAddr};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Config {
    /// Address the coordinator accepts clients on, e.g. "127.0.0.1:5432".
    pub listen: String,
    pub coordinator_db: DatabaseConfig,
    /// Workers registered at start-up if the catalog does not know them yet.
    #[serde(default)]
    pub workers: Vec<NodeConfig>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DatabaseConfig {
    pub host: String,
    pub port: u16,
    #[serde(default = "default_user")]
    pub user: String,
    #[serde(default = "default_user")]
    pub database: String,
    #[serde(default)]
    pub password: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NodeConfig {
    pub host: String,
    pub port: u16,
}

fn default_user() -> String {
    "postgres".into()
}

impl Config {
    pub fn load(path: &std::path::Path) -> anyhow::Result<Config> {
        let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("could not read {}: {e}", path.display()))?;
        toml::from_str(&text).map_err(|e| anyhow::anyhow!("invalid configuration {}: {e}", path.display()))
    }

    pub fn coordinator_db_addr(&self) -> ServerAddr {
        ServerAddr { host: self.coordinator_db.host.clone(), port: self.coordinator_db.port }
    }

    /// The identity the coordinator uses for its own catalog work.
    pub fn service_login(&self) -> Login {
        Login {
            user: self.coordinator_db.user.clone(),
            database: self.coordinator_db.database.clone(),
            password: self.coordinator_db.password.clone(),
            options: vec![("application_name".into(), "tessera".into())],
        }
    }
}
