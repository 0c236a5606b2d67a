//! The owner of each shard's table at run time: the run token and its queue of requests
//! (`run_token`), the owner's one step (`owner`), the requests (`request`), the grant channel
//! (`grant`), the kameo actor (`actor`), the shard router (`shard`), the stall warnings
//! (`stall`) and the shard's metrics (`metrics`).

pub(crate) mod actor;
pub(crate) mod grant;
pub(crate) mod metrics;
pub(crate) mod owner;
pub(crate) mod request;
pub(crate) mod run_token;
pub(crate) mod shard;
pub(crate) mod stall;
