//! How EXPLAIN shows a distributed plan: as the steps the coordinator takes
//! (a tree of `Step`s, each with its properties and, under it, other steps
//! or a node's own plan), printed in TEXT as indented lines the way
//! PostgreSQL prints its own plans, or in JSON as one document whose node
//! plans are the nodes' own JSON plans.

use serde_json::{Map, Value};

/// What a step is.
pub(super) enum Title {
    /// A custom scan, by its provider ("Tessera Router").
    Scan(&'static str),
    /// One task, on the node its properties name.
    Task,
    /// A subquery computed first: its number and SQL.
    Subquery(usize, String),
}

/// One step of a distributed plan.
pub(super) struct Step {
    title: Title,
    properties: Vec<(String, String)>,
    under: Vec<Under>,
}

/// What a step holds under it.
pub(super) enum Under {
    Step(Step),
    /// A node's plan of its part, as that node's EXPLAIN printed it: its
    /// rows in TEXT, its one row in JSON.
    NodePlan(Vec<String>),
}

impl Step {
    pub fn new(title: Title) -> Step {
        Step { title, properties: Vec::new(), under: Vec::new() }
    }

    pub fn property(&mut self, name: impl Into<String>, value: impl ToString) {
        self.properties.push((name.into(), value.to_string()));
    }

    pub fn push(&mut self, under: Under) {
        self.under.push(under);
    }

    /// The plan as TEXT: a line per row.
    pub fn text_lines(&self) -> Vec<String> {
        let mut lines = vec![match &self.title {
            Title::Scan(provider) => format!("Custom Scan ({provider})"),
            Title::Task => "Task".to_string(),
            Title::Subquery(i, sql) => format!("Subquery {i}: {sql}"),
        }];
        lines.extend(self.properties.iter().map(|(name, value)| format!("  {name}: {value}")));
        for under in &self.under {
            let under_lines = match under {
                Under::Step(step) => step.text_lines(),
                Under::NodePlan(rows) => rows.clone(),
            };
            // Under an arrow, indented to sit below this step's line.
            for (i, line) in under_lines.into_iter().enumerate() {
                let arrow = if i == 0 { "->  " } else { "    " };
                lines.push(format!("  {arrow}{line}"));
            }
        }
        lines
    }

    /// The plan as JSON, in the shape of PostgreSQL's own (`[{"Plan": …}]`).
    pub fn json(&self) -> String {
        let mut top = Map::new();
        top.insert("Plan".to_string(), self.json_value());
        serde_json::to_string_pretty(&Value::Array(vec![Value::Object(top)])).expect("a JSON value prints")
    }

    fn json_value(&self) -> Value {
        let mut object = Map::new();
        match &self.title {
            Title::Scan(provider) => {
                object.insert("Node Type".into(), "Custom Scan".into());
                object.insert("Custom Plan Provider".into(), (*provider).into());
            }
            Title::Task => {
                object.insert("Node Type".into(), "Task".into());
            }
            Title::Subquery(i, sql) => {
                object.insert("Node Type".into(), "Subquery".into());
                object.insert("Subquery Number".into(), (*i as u64).into());
                object.insert("Query".into(), sql.clone().into());
            }
        }
        for (name, value) in &self.properties {
            let value = value.parse::<i64>().map_or_else(|_| Value::from(value.clone()), Value::from);
            object.insert(name.clone(), value);
        }
        let mut steps = Vec::new();
        for under in &self.under {
            match under {
                Under::Step(step) => steps.push(step.json_value()),
                Under::NodePlan(rows) => {
                    let text = rows.join("\n");
                    object.insert("Remote Plan".into(), serde_json::from_str(&text).unwrap_or(Value::String(text)));
                }
            }
        }
        if !steps.is_empty() {
            object.insert("Plans".into(), Value::Array(steps));
        }
        Value::Object(object)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn router() -> Step {
        let mut task = Step::new(Title::Task);
        task.property("Node", "host=127.0.0.1 port=5432 dbname=postgres");
        task.push(Under::NodePlan(vec!["Index Scan using t_pkey_102008 on t_102008 t".into(), "  Index Cond: (k = 1)".into()]));
        let mut scan = Step::new(Title::Scan("Tessera Router"));
        scan.property("Task Count", 1);
        scan.property("Tasks Shown", "All");
        scan.push(Under::Step(task));
        scan
    }

    #[test]
    fn text_nests_under_arrows() {
        assert_eq!(
            router().text_lines(),
            vec![
                "Custom Scan (Tessera Router)",
                "  Task Count: 1",
                "  Tasks Shown: All",
                "  ->  Task",
                "        Node: host=127.0.0.1 port=5432 dbname=postgres",
                "        ->  Index Scan using t_pkey_102008 on t_102008 t",
                "              Index Cond: (k = 1)",
            ]
        );
    }

    #[test]
    fn json_keeps_the_node_plan_as_json() {
        let mut task = Step::new(Title::Task);
        task.push(Under::NodePlan(vec![r#"[{"Plan": {"Node Type": "Seq Scan"}}]"#.into()]));
        let mut scan = Step::new(Title::Scan("Tessera Multi-Shard"));
        scan.property("Task Count", 32);
        scan.push(Under::Step(task));
        let value: Value = serde_json::from_str(&scan.json()).unwrap();
        let plan = &value[0]["Plan"];
        assert_eq!(plan["Node Type"], "Custom Scan");
        assert_eq!(plan["Custom Plan Provider"], "Tessera Multi-Shard");
        assert_eq!(plan["Task Count"], 32);
        assert_eq!(plan["Plans"][0]["Remote Plan"][0]["Plan"]["Node Type"], "Seq Scan");
    }
}
