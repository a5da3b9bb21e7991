//! `SET memwal.<option> = <value>`: the writer options
//! ([`WriterOptions::NAMES`]) as a DataFusion config extension, so that
//! `SHOW ALL` and `information_schema.df_settings` list them and an unknown
//! name or a bad value fails the statement with what was expected. The
//! session opens its tables with the new options once a `SET` passes
//! [`WriterOptions::check`] (see `MemwalSession::execute`).

use std::any::Any;

use datafusion::common::config::{ConfigEntry, ConfigExtension, ExtensionOptions};
use datafusion::error::{DataFusionError, Result};

use crate::writer::WriterOptions;

/// The writer options a session's `SET memwal.*` statements edit.
#[derive(Debug, Clone)]
pub struct MemwalConfig {
    /// The options as the statements so far left them.
    pub writer: WriterOptions,
}

impl ConfigExtension for MemwalConfig {
    const PREFIX: &'static str = "memwal";
}

impl ExtensionOptions for MemwalConfig {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    fn cloned(&self) -> Box<dyn ExtensionOptions> {
        Box::new(self.clone())
    }

    fn set(&mut self, key: &str, value: &str) -> Result<()> {
        self.writer
            .set(key, value)
            .map_err(|e| DataFusionError::Configuration(e.to_string()))
    }

    fn entries(&self) -> Vec<ConfigEntry> {
        WriterOptions::NAMES
            .iter()
            .map(|name| ConfigEntry {
                key: format!("{}.{name}", Self::PREFIX),
                value: self.writer.get(name),
                description: WriterOptions::describe(name),
            })
            .collect()
    }
}
