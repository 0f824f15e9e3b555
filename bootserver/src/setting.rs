//! What a room's settings conversion says when a value is wrong. Each room (DHCP, TFTP, HTTP,
//! credentials, discovery, the file's machines) turns its part of the configuration file
//! into its runtime type itself; [`crate::config`] only assembles them. The message starts
//! with the field's path in the file (`dhcp.uefiBootFile …`), so that the operator knows
//! where to look.

/// A value of the configuration file that is wrong, with the field's path in the message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidSetting(pub String);
