//! The HTTP face: the routes, their handlers, and every error as JSON `{"error": "..."}`.
//!
//! | request | answer |
//! |---|---|
//! | `POST /accounts/{id}/credit`, `{"amount": n}` | 200 `{"id": id, "balance": b}` |
//! | `POST /accounts/{id}/debit`, `{"amount": n}` | 200 as above; 409 if the balance is below `n` |
//! | `GET /accounts/{id}` | 200 as above; an account never credited has balance 0 |
//! | `GET /stats` | 200, the registry's counts: `keys`, `held`, `holders`, `permits`, `waiting`, `grants` |
//! | `GET /locks`, `GET /locks?top=n` | 200, the most contended accounts' locks (see `locks.rs`) |
//! | `GET /locks/page` | 200, the same as an HTML page that reloads itself every second |
//!
//! Errors: 400 for JSON that does not parse, an id that is not a `u64` or a `top` that is not
//! a whole number from 1 to 1000, 415 without
//! `content-type: application/json`, 422 for a body without a whole-number `amount` from 1 to
//! [`MAX_AMOUNT`], 409 for an overdraft (or a balance that would pass `u64::MAX`), 404 for an
//! unknown path, 405 for a wrong method, 503 if the lock registry has shut down.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{Json, Path, State};
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use keyed_locks::{LockError, LockRegistry};
use serde::{Deserialize, Serialize};

use crate::accounts::{Accounts, Change, Refused};

/// The largest amount one credit or debit may move, in minor units (ten million in cents).
pub const MAX_AMOUNT: u64 = 1_000_000_000;

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    /// One lock per account id.
    pub registry: LockRegistry<u64>,
    pub accounts: Arc<Accounts>,
    /// False with `--unsafe-no-lock`: read-modify-writes of one account may then overlap.
    pub lock_accounts: bool,
    /// How long each credit and debit waits for its payment provider (`--work-ms`), inside
    /// its account's lock.
    pub work: Duration,
    /// Whether the registry keeps a journal (`--journal`), to draw at `/locks/page`.
    pub journal: bool,
}

/// The service's routes, without `/metrics` (see `metrics.rs`) and without fallbacks.
pub fn routes(state: AppState) -> Router {
    Router::new()
        .route("/accounts/{id}", get(balance))
        .route("/accounts/{id}/credit", post(credit))
        .route("/accounts/{id}/debit", post(debit))
        .route("/stats", get(stats))
        .with_state(state)
}

/// JSON 404 and 405 answers for every path and method `router` does not serve. Call it last,
/// once every route is in.
pub fn with_fallbacks(router: Router) -> Router {
    router
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
}

/// The body of a credit or a debit. A JSON number of any kind is accepted here and checked
/// by [`amount`], so that `-5`, `2.5` and `1e30` get a message about amounts, not about types.
#[derive(Deserialize)]
struct ChangeBody {
    amount: serde_json::Number,
}

/// An account's balance, the answer to every successful request about one account.
#[derive(Serialize)]
struct Balance {
    id: u64,
    balance: u64,
}

/// The registry's counts, as `GET /stats` returns them.
#[derive(Serialize)]
struct Stats {
    keys: usize,
    held: usize,
    holders: usize,
    permits: usize,
    waiting: usize,
    grants: u64,
}

async fn credit(
    State(state): State<AppState>,
    id: Result<Path<u64>, PathRejection>,
    body: Result<Json<ChangeBody>, JsonRejection>,
) -> Result<Json<Balance>, ApiError> {
    let (id, amount) = change_request(id, body)?;
    change(&state, id, Change::Credit(amount)).await
}

async fn debit(
    State(state): State<AppState>,
    id: Result<Path<u64>, PathRejection>,
    body: Result<Json<ChangeBody>, JsonRejection>,
) -> Result<Json<Balance>, ApiError> {
    let (id, amount) = change_request(id, body)?;
    change(&state, id, Change::Debit(amount)).await
}

/// The account and the amount of a credit or debit, checked in that order.
fn change_request(
    id: Result<Path<u64>, PathRejection>,
    body: Result<Json<ChangeBody>, JsonRejection>,
) -> Result<(u64, u64), ApiError> {
    let Path(id) = id?;
    let Json(body) = body?;
    Ok((id, amount(&body.amount)?))
}

/// The read-modify-write of one account, under the account's lock.
async fn change(state: &AppState, id: u64, change: Change) -> Result<Json<Balance>, ApiError> {
    // While this guard lives, every other credit or debit of `id` waits its turn (FIFO);
    // other accounts go on. Dropped on every exit, early returns and cancellation included.
    let guard = if state.lock_accounts {
        Some(state.registry.lock(id).await?)
    } else {
        None
    };
    let balance = state.accounts.read(id).await;
    let balance = change.apply(balance)?;
    // The money moves at the provider before the new balance is written, so the lock is held
    // across the call: that is what makes a slow provider show up as waiters at `/locks`.
    if !state.work.is_zero() {
        tokio::time::sleep(state.work).await;
    }
    state.accounts.write(id, balance);
    drop(guard);
    Ok(Json(Balance { id, balance }))
}

/// A read needs no lock: it sees the last balance written.
async fn balance(
    State(state): State<AppState>,
    id: Result<Path<u64>, PathRejection>,
) -> Result<Json<Balance>, ApiError> {
    let Path(id) = id?;
    let balance = state.accounts.read(id).await;
    Ok(Json(Balance { id, balance }))
}

async fn stats(State(state): State<AppState>) -> Result<Json<Stats>, ApiError> {
    let stats = state.registry.stats().await?;
    Ok(Json(Stats {
        keys: stats.keys,
        held: stats.held,
        holders: stats.holders,
        permits: stats.permits,
        waiting: stats.waiting,
        grants: stats.grants,
    }))
}

/// The amount of a credit or debit: a whole number from 1 to [`MAX_AMOUNT`].
fn amount(value: &serde_json::Number) -> Result<u64, ApiError> {
    match value.as_u64() {
        Some(amount @ 1..=MAX_AMOUNT) => Ok(amount),
        _ => Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("amount must be a whole number from 1 to {MAX_AMOUNT}, not {value}"),
        )),
    }
}

async fn no_route(method: Method, uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("no route for {method} {}", uri.path()),
    )
}

async fn wrong_method(method: Method, uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{} does not take {method}", uri.path()),
    )
}

/// A failed request: its status, and the message sent as `{"error": message}`.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
        }
    }
}

#[derive(Serialize)]
struct ErrorBody {
    error: String,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: self.message,
        };
        (self.status, Json(body)).into_response()
    }
}

/// axum's own answer to a body it cannot read (400, 413, 415 or 422), as JSON.
impl From<JsonRejection> for ApiError {
    fn from(rejection: JsonRejection) -> Self {
        ApiError::new(rejection.status(), rejection.body_text())
    }
}

/// axum's own answer to an id that is not a `u64` (400), as JSON.
impl From<PathRejection> for ApiError {
    fn from(rejection: PathRejection) -> Self {
        ApiError::new(rejection.status(), rejection.body_text())
    }
}

impl From<Refused> for ApiError {
    fn from(refused: Refused) -> Self {
        ApiError::new(StatusCode::CONFLICT, refused.to_string())
    }
}

/// The registry only fails once it has shut down.
impl From<LockError> for ApiError {
    fn from(error: LockError) -> Self {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, error.to_string())
    }
}
