//! What stops the share-group mode ([`Error`]), and which Kafka failures no retry fixes.

use krafka::{KrafkaError, ProtocolErrorKind};

/// What stops the share-group mode.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot connect to Kafka at {bootstrap}")]
    Connect {
        bootstrap: String,
        #[source]
        source: KrafkaError,
    },
    #[error("Kafka security settings: {0}")]
    Security(String),
    #[error(
        "cannot configure share group {group} (share groups need Kafka 4.2 or later with the \
         share.version feature enabled, and, with ACLs, ALTER_CONFIGS on the group)"
    )]
    GroupConfig {
        group: String,
        #[source]
        source: KrafkaError,
    },
    #[error("cannot join share group {group}")]
    Join {
        group: String,
        #[source]
        source: KrafkaError,
    },
    #[error("share group {group} cannot consume")]
    Consume {
        group: String,
        #[source]
        source: KrafkaError,
    },
    #[error("a share group member panicked: {0}")]
    Panicked(String),
}

impl Error {
    /// Whether trying again cannot help.
    pub(super) fn is_fatal(&self) -> bool {
        match self {
            Self::Connect { source, .. }
            | Self::Join { source, .. }
            | Self::Consume { source, .. }
            | Self::GroupConfig { source, .. } => is_fatal(source),
            Self::Security(_) | Self::Panicked(_) => true,
        }
    }
}

/// Whether `error` is one no retry fixes: wrong settings, refused credentials or
/// permissions, or a broker that has no share groups.
pub(super) fn is_fatal(error: &KrafkaError) -> bool {
    use krafka::error::ErrorCode;
    matches!(error, KrafkaError::Config { .. } | KrafkaError::Auth { .. })
        || error.protocol_error_kind() == Some(ProtocolErrorKind::UnknownApiVersion)
        || matches!(
            error,
            KrafkaError::Broker {
                code: ErrorCode::GroupAuthorizationFailed
                    | ErrorCode::TopicAuthorizationFailed
                    | ErrorCode::ClusterAuthorizationFailed
                    | ErrorCode::SaslAuthenticationFailed,
                ..
            }
        )
}
