//! Input templates (prompts) from the `--config` TOML file:
//!
//! ```toml
//! default_prompt_name = "query"      # optional
//! max_input_length = 512             # optional cap on tokens per input
//! [prompts]
//! query = "query: "
//! document = "passage: "
//!
//! # several models behind one Ivy: a table per model (by a name it is
//! # served under) replaces the top level for that model
//! [models."BAAI/bge-reranker-base"]
//! max_input_length = 512
//! [models.my-embedder.prompts]
//! query = "Represent this query: "
//! ```
//!
//! A prompt is prepended to each text before tokenization. The file is
//! reloaded on SIGHUP and when its contents change; a file that does not
//! parse or validate is refused with a log line and the running templates
//! stay. In-flight requests keep the templates they started with.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use serde::Deserialize;

use crate::error::ApiError;
use crate::metrics::Metrics;

/// How often the file is read to notice changes (it is small; a Kubernetes
/// ConfigMap update swaps a symlink, which no inode watch on the file sees).
const POLL: Duration = Duration::from_secs(1);

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    default_prompt_name: Option<String>,
    #[serde(default)]
    max_input_length: Option<usize>,
    #[serde(default)]
    prompts: BTreeMap<String, String>,
    /// Per model (by served name): replaces the top level for it.
    #[serde(default)]
    models: BTreeMap<String, Section>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Section {
    default_prompt_name: Option<String>,
    #[serde(default)]
    max_input_length: Option<usize>,
    #[serde(default)]
    prompts: BTreeMap<String, String>,
}

/// One accepted version of the templates.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Templates {
    pub default_prompt_name: Option<String>,
    pub prompts: BTreeMap<String, String>,
    /// Cap on tokens per input (None: no cap from the file).
    pub max_input_length: Option<usize>,
    /// The file's per-model tables (by served name).
    pub models: BTreeMap<String, Arc<Templates>>,
}

impl Templates {
    /// Parses and validates the file's text.
    pub fn parse(text: &str) -> Result<Self, String> {
        let file: File = toml::from_str(text).map_err(|e| e.to_string())?;
        let mut top = Self::section(Section {
            default_prompt_name: file.default_prompt_name,
            max_input_length: file.max_input_length,
            prompts: file.prompts,
        })?;
        for (name, section) in file.models {
            let t = Self::section(section).map_err(|e| format!("[models.\"{name}\"]: {e}"))?;
            top.models.insert(name, Arc::new(t));
        }
        Ok(top)
    }

    fn section(file: Section) -> Result<Self, String> {
        if let Some(name) = &file.default_prompt_name {
            if !file.prompts.contains_key(name) {
                return Err(format!(
                    "default_prompt_name `{name}` is not in [prompts] (known: {})",
                    names(&file.prompts)
                ));
            }
        }
        if file.max_input_length == Some(0) {
            return Err(
                "max_input_length must be positive (leave it out for the model's maximum)".into(),
            );
        }
        Ok(Self {
            default_prompt_name: file.default_prompt_name,
            prompts: file.prompts,
            max_input_length: file.max_input_length,
            models: BTreeMap::new(),
        })
    }

    /// The templates for a model served under `names`: its table, else
    /// the top level.
    pub fn for_model(self: Arc<Self>, names: &[String]) -> Arc<Self> {
        match names.iter().find_map(|n| self.models.get(n)) {
            Some(t) => Arc::clone(t),
            None => self,
        }
    }

    /// The model's own prompts (sentence-transformers `prompts`, sent by the
    /// replicas): the templates when no `--config` file is given.
    pub fn from_model(prompts: &std::collections::HashMap<String, String>, default: &str) -> Self {
        let prompts: BTreeMap<String, String> = prompts
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let default_prompt_name =
            (!default.is_empty() && prompts.contains_key(default)).then(|| default.to_string());
        Self {
            default_prompt_name,
            prompts,
            max_input_length: None,
            models: BTreeMap::new(),
        }
    }

    /// `texts` with the request's prompt prepended (the named one, else
    /// the default; unchanged when there is none): the one place a prompt
    /// is applied, for embedding and for the tokenize route alike.
    pub fn apply(
        &self,
        prompt_name: Option<&str>,
        texts: Vec<String>,
    ) -> Result<Vec<String>, ApiError> {
        Ok(match self.prefix(prompt_name)? {
            Some(prefix) => texts.into_iter().map(|t| format!("{prefix}{t}")).collect(),
            None => texts,
        })
    }

    /// The prefix for a request: the named prompt, else the default one.
    pub fn prefix(&self, prompt_name: Option<&str>) -> Result<Option<&str>, ApiError> {
        let Some(name) = prompt_name.or(self.default_prompt_name.as_deref()) else {
            return Ok(None);
        };
        match self.prompts.get(name) {
            Some(p) => Ok(Some(p.as_str())),
            None if self.prompts.is_empty() => Err(ApiError::validation(
                "prompt_name",
                format!("prompt_name `{name}` is unknown: no prompt templates are configured"),
            )),
            None => Err(ApiError::validation(
                "prompt_name",
                format!(
                    "prompt_name `{name}` is unknown; configured prompts: {}",
                    names(&self.prompts)
                ),
            )),
        }
    }
}

fn names(prompts: &BTreeMap<String, String>) -> String {
    prompts
        .keys()
        .map(|k| format!("`{k}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The running templates and where they come from.
pub struct TemplateStore {
    path: Option<PathBuf>,
    current: RwLock<Arc<Templates>>,
    /// The file contents last looked at (accepted or refused), so a refused
    /// file is not re-logged every poll.
    last_seen: Mutex<Option<Vec<u8>>>,
    metrics: Arc<Metrics>,
}

impl TemplateStore {
    /// Loads the file (a bad file at start-up is an error: there is no
    /// previous version to keep).
    pub fn open(path: Option<PathBuf>, metrics: Arc<Metrics>) -> Result<Self, String> {
        let (templates, seen) = match &path {
            None => (Templates::default(), None),
            Some(p) => {
                let bytes = std::fs::read(p)
                    .map_err(|e| format!("cannot read --config {}: {e}", p.display()))?;
                let t = Templates::parse(&String::from_utf8_lossy(&bytes))
                    .map_err(|e| format!("invalid --config {}: {e}", p.display()))?;
                (t, Some(bytes))
            }
        };
        Ok(Self {
            path,
            current: RwLock::new(Arc::new(templates)),
            last_seen: Mutex::new(seen),
            metrics,
        })
    }

    /// Whether a `--config` file is in charge (else the model's prompts).
    pub fn has_file(&self) -> bool {
        self.path.is_some()
    }

    pub fn get(&self) -> Arc<Templates> {
        Arc::clone(&self.current.read().expect("templates lock poisoned"))
    }

    /// Re-reads the file. `force` reloads even if the bytes did not change
    /// (SIGHUP). Returns whether new templates were installed.
    pub fn reload(&self, force: bool) -> bool {
        let Some(path) = &self.path else {
            return false;
        };
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) => {
                if force {
                    tracing::error!(path = %path.display(), error = %e, "config reload refused: cannot read the file; keeping the running templates");
                    self.metrics.config_reload(false);
                }
                return false;
            }
        };
        {
            let mut seen = self.last_seen.lock().expect("templates lock poisoned");
            if !force && seen.as_deref() == Some(&bytes[..]) {
                return false;
            }
            *seen = Some(bytes.clone());
        }
        match Templates::parse(&String::from_utf8_lossy(&bytes)) {
            Ok(t) => {
                tracing::info!(path = %path.display(), prompts = t.prompts.len(),
                               default = ?t.default_prompt_name, "config reloaded");
                *self.current.write().expect("templates lock poisoned") = Arc::new(t);
                self.metrics.config_reload(true);
                true
            }
            Err(e) => {
                tracing::error!(path = %path.display(), error = %e, "config reload refused; keeping the running templates");
                self.metrics.config_reload(false);
                false
            }
        }
    }

    /// Reloads on SIGHUP and whenever the file's contents change.
    pub fn spawn_watchers(self: &Arc<Self>) {
        if self.path.is_none() {
            return;
        }
        let this = Arc::clone(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(POLL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                this.reload(false);
            }
        });
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let this = Arc::clone(self);
            match signal(SignalKind::hangup()) {
                Ok(mut hup) => {
                    tokio::spawn(async move {
                        while hup.recv().await.is_some() {
                            tracing::info!("SIGHUP: reloading the config");
                            this.reload(true);
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot listen for SIGHUP; config reloads on file change only")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "default_prompt_name = \"query\"\n[prompts]\nquery = \"query: \"\ndocument = \"passage: \"\n";

    #[test]
    fn parses_the_documented_format() {
        let t = Templates::parse(GOOD).unwrap();
        assert_eq!(t.prefix(None).unwrap(), Some("query: "));
        assert_eq!(t.prefix(Some("document")).unwrap(), Some("passage: "));
        let err = t.prefix(Some("doc")).unwrap_err().to_string();
        assert!(err.contains("`doc`") && err.contains("`document`"), "{err}");
    }

    #[test]
    fn a_table_per_model_replaces_the_top_level() {
        let text = format!(
            "{GOOD}[models.\"org/reranker\"]\nmax_input_length = 64\n\
             [models.e5.prompts]\nquery = \"q: \"\n"
        );
        let t = Arc::new(Templates::parse(&text).unwrap());
        let reranker = Arc::clone(&t).for_model(&["org/reranker".into(), "reranker".into()]);
        assert_eq!(
            (reranker.prefix(None).unwrap(), reranker.max_input_length),
            (None, Some(64))
        );
        let e5 = Arc::clone(&t).for_model(&["org/e5".into(), "e5".into()]);
        assert_eq!(e5.prefix(Some("query")).unwrap(), Some("q: "));
        let other = Arc::clone(&t).for_model(&["other".into()]);
        assert_eq!(other.prefix(None).unwrap(), Some("query: "));
        assert!(Templates::parse("[models.x]\nprompt = 1\n").is_err());
        assert!(
            Templates::parse("[models.x]\ndefault_prompt_name = \"q\"\n")
                .unwrap_err()
                .contains("[models.\"x\"]")
        );
    }

    #[test]
    fn no_templates_means_no_prefix() {
        let t = Templates::default();
        assert_eq!(t.prefix(None).unwrap(), None);
        assert!(t
            .prefix(Some("query"))
            .unwrap_err()
            .to_string()
            .contains("no prompt templates"));
    }

    #[test]
    fn refuses_broken_files() {
        for bad in [
            "default_prompt_name = \"missing\"\n[prompts]\nquery = \"q: \"\n",
            "[prompts]\nquery = 3\n",
            "[prompts\nquery = \"q\"",
            "prompt = \"typo\"\n",
            "max_input_length = 0\n",
        ] {
            assert!(Templates::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn reload_keeps_old_templates_on_a_bad_file() {
        let dir = std::env::temp_dir().join(format!("ivy-templates-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.toml");
        std::fs::write(&path, GOOD).unwrap();
        let store = TemplateStore::open(Some(path.clone()), Arc::new(Metrics::new())).unwrap();
        assert!(!store.reload(false), "unchanged file must not reload");
        std::fs::write(&path, "[prompts\n").unwrap();
        assert!(!store.reload(false));
        assert_eq!(store.get().prefix(None).unwrap(), Some("query: "));
        std::fs::write(&path, "[prompts]\nquery = \"q: \"\n").unwrap();
        assert!(store.reload(false));
        assert_eq!(store.get().prefix(Some("query")).unwrap(), Some("q: "));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
