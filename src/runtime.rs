//! The owner of each shard's table at run time: the run token and its queue of requests
//! (`run_token`), the owner's one step (`owner`), the requests (`request`), the grant channel
//! (`grant`), the kameo actor (`actor`) and the shard router (`shard`).

pub(crate) mod actor;
pub(crate) mod grant;
pub(crate) mod owner;
pub(crate) mod request;
pub(crate) mod run_token;
pub(crate) mod shard;
