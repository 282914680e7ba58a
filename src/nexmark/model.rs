//! The Nexmark records: people, auctions and bids.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::time::Timestamp;

/// A person registering with the auction site.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Person {
    /// Unique id (the k-th person has id 1000 + k).
    pub id: i64,
    /// "First Last".
    pub name: String,
    /// An email address.
    pub email_address: String,
    /// Four groups of four digits.
    pub credit_card: String,
    /// A US city.
    pub city: String,
    /// A US state code.
    pub state: String,
    /// Event time, epoch ms.
    pub date_time: Timestamp,
    /// Filler.
    pub extra: String,
}

/// An auction opened by a seller.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Auction {
    /// Unique id (the k-th auction has id 1000 + k).
    pub id: i64,
    /// Item name.
    pub item_name: String,
    /// Item description.
    pub description: String,
    /// Opening price, cents.
    pub initial_bid: i64,
    /// Reserve price, cents.
    pub reserve: i64,
    /// Event time (opening), epoch ms.
    pub date_time: Timestamp,
    /// Closing time, epoch ms.
    pub expires: Timestamp,
    /// The seller's person id.
    pub seller: i64,
    /// Category, 10 to 14.
    pub category: i64,
    /// Filler.
    pub extra: String,
}

/// A bid on an auction.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Bid {
    /// The auction's id.
    pub auction: i64,
    /// The bidder's person id.
    pub bidder: i64,
    /// Price, cents.
    pub price: i64,
    /// Channel name (shared between bids of the same channel).
    pub channel: Arc<str>,
    /// URL of the channel (shared likewise).
    pub url: Arc<str>,
    /// Event time, epoch ms.
    pub date_time: Timestamp,
    /// Filler.
    pub extra: String,
}

/// One Nexmark event.
///
/// People and auctions are boxed: bids are 92 % of the events, and keeping the
/// enum as small as a bid makes every move of an event cheaper.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Event {
    /// A new person (`event_type` 0).
    Person(Box<Person>),
    /// A new auction (`event_type` 1).
    Auction(Box<Auction>),
    /// A bid (`event_type` 2).
    Bid(Bid),
}

impl Event {
    /// The event time.
    #[inline]
    pub fn time(&self) -> Timestamp {
        match self {
            Event::Person(p) => p.date_time,
            Event::Auction(a) => a.date_time,
            Event::Bid(b) => b.date_time,
        }
    }
}
